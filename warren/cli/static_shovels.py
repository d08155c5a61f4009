"""The classic config file's static shovels, `{rabbitmq_shovel, [{shovels, [{Name, [...]}]}]}`,
read as RabbitMQ 3.10.8's rabbit_shovel_config:parse reads them, in both its formats:

- the current one: `{source, [...]}` (uris, declarations, queue, prefetch_count,
  delete_after, consumer_args), `{destination, [...]}` (uris, declarations, publish_fields,
  publish_properties, add_forward_headers, add_timestamp_header), ack_mode (no_ack by
  default) and reconnect_delay (5);
- the legacy one (no `source`): `{sources, [{broker(s), ...}, {declarations, ...}]}`,
  `{destinations, [...]}`, and the rest at the top (queue, prefetch_count, ack_mode, on_confirm
  by default, publish_fields, ...).

Each becomes a warren.broker.shovel_config.Config (static=True, its declarations as AMQP
methods), which warren.broker.static_shovel runs. RabbitMQ checks some of this when it
starts (a bad one stops the node) and the rest only when the shovel runs, or never; Warren
checks all of it here, and refuses what it does not do (AMQP 1.0, a declaration that is not
one of warren.broker.shovel_declarations' methods, mandatory publishes), each problem with
the line and the key (rabbitmq_shovel.shovels.NAME.source.queue ...).
"""

from __future__ import annotations

import datetime
import difflib
from typing import Any, NoReturn

from ..amqp import spec
from ..amqp.codec import encode_table, typed_int
from ..amqp.uri import UriError
from ..broker.shovel import PUBLISH_PROPERTIES, parse_uri
from ..broker.shovel_config import DEFAULT_PREFETCH, DEFAULT_RECONNECT_DELAY, Config
from ..broker.shovel_declarations import REPLIES
from .erlang_terms import Atom, format_term

ACK_MODES = {"no_ack": "no-ack", "on_publish": "on-publish", "on_confirm": "on-confirm"}
# The AMQP methods a declaration may be (by RabbitMQ's name), the fields each must be given
# (rabbit_framing's records have no default for them) and the defaults that differ from the
# wire's zero values.
DECLARATIONS = {cls.NAME: cls for cls in REPLIES}
_REQUIRED = {"exchange.declare": ("exchange",), "exchange.delete": ("exchange",),
             "exchange.bind": ("destination", "source"), "exchange.unbind": ("destination", "source"),
             "queue.bind": ("exchange",), "queue.unbind": ("exchange",)}
_DEFAULTS = {"exchange.declare": {"type": "direct"}}
# basic.publish's fields (publish_fields).
PUBLISH_FIELDS = ("ticket", "exchange", "routing_key", "mandatory", "immediate")
# The P_basic fields (publish_properties): Warren's dynamic ones and the headers table.
PROPERTIES = dict(PUBLISH_PROPERTIES, headers="table")
# Field table value types (rabbit_binary_generator's names) and the integer ranges.
_INT_RANGES = {"byte": (-2 ** 7, 2 ** 7 - 1), "short": (-2 ** 15, 2 ** 15 - 1), "signedint": (-2 ** 31, 2 ** 31 - 1),
               "long": (-2 ** 63, 2 ** 63 - 1), "unsignedbyte": (0, 2 ** 8 - 1), "unsignedshort": (0, 2 ** 16 - 1),
               "unsignedint": (0, 2 ** 32 - 1)}
TABLE_TYPES = ("longstr", "binary", "bool", *_INT_RANGES, "double", "timestamp", "void", "table", "array")


class Problem(ValueError):
    """A bad static shovel: the line of the term, the key, why."""

    def __init__(self, line: int, key: str, reason: str):
        super().__init__(reason)
        self.line = line
        self.key = key
        self.reason = reason


def parse(term: Any, line: int, key: str) -> tuple[dict[str, Config], list[Problem]]:
    """The shovels of rabbitmq_shovel's `shovels` (its term, the line of its tuple, its key):
    name -> Config in the file's order, and the problems (the first of each shovel)."""
    if not isinstance(term, list):
        return {}, [Problem(line, key, "expected a list of {Name, [...]} shovels such as "
                                       f"[{{my_shovel, [{{source, [...]}}, {{destination, [...]}}]}}], "
                                       f"got {format_term(term)}")]
    shovels: dict[str, Config] = {}
    problems = []
    seen = set()
    for item in term:
        at = getattr(item, "line", 0) or line
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom)
                and isinstance(item[1], list)):
            # (RabbitMQ: require_list_of_shovel_configurations)
            problems.append(Problem(at, key, "expected a {Name, [...]} shovel with an atom for its name, "
                                             f"got {format_term(item)}"))
            continue
        name = item[0].name
        if name in seen:
            problems.append(Problem(at, f"{key}.{name}", "a second shovel of this name "
                                                         "(RabbitMQ: duplicate_shovel_definition)"))
            continue
        seen.add(name)
        try:
            shovels[name] = _Shovel(f"{key}.{name}", at).config(item[1])
        except Problem as problem:
            problems.append(problem)
    return shovels, problems


class _Shovel:
    """Reads one shovel's terms; a Problem at the first bad one."""

    def __init__(self, key: str, line: int):
        self.key = key
        self.line = line

    def fail(self, line: int, key: str, reason: str) -> NoReturn:
        raise Problem(line, key, reason)

    # ------------------------------------------------------------ proplists
    def proplist(self, term: Any, line: int, key: str, known: tuple[str, ...]) -> dict[str, tuple[Any, int]]:
        """A [{key, value}] list: key -> (value, the line of its tuple). Keys outside `known`
        and a key given twice are refused (RabbitMQ ignores unknown keys, and takes the first
        of two where it does not refuse them: duplicate_parameters)."""
        if not isinstance(term, list):
            self.fail(line, key, f"expected a list of {{key, value}} tuples, got {format_term(term)}")
        out: dict[str, tuple[Any, int]] = {}
        for item in term:
            at = getattr(item, "line", 0) or line
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom)):
                self.fail(at, key, f"expected a {{key, value}} tuple, got {format_term(item)}")
            name = item[0].name
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                self.fail(at, f"{key}.{name}", "unknown key" + (f" (did you mean {key}.{close[0]}?)" if close
                                                                else f" (the keys here: {', '.join(known)})"))
            if name in out:
                self.fail(at, f"{key}.{name}", "given twice (RabbitMQ: duplicate_parameters)")
            out[name] = (item[1], at)
        return out

    def required(self, props: dict, name: str, line: int, key: str) -> tuple[Any, int]:
        if name not in props:
            self.fail(line, key, f"missing {{{name}, ...}} (RabbitMQ: missing_parameter {name})")
        return props[name]

    # --------------------------------------------------------------- shovel
    def config(self, term: list) -> Config:
        key, line = self.key, self.line
        top = self.proplist(term, line, key, ("source", "destination", "sources", "destinations", "queue",
                                              "prefetch_count", "ack_mode", "publish_fields", "publish_properties",
                                              "add_forward_headers", "add_timestamp_header", "reconnect_delay",
                                              "delete_after"))
        if "source" in top:
            return self.current(top)
        return self.legacy(top)

    def current(self, top: dict) -> Config:
        """rabbit_shovel_config:parse_current."""
        key, line = self.key, self.line
        self.only(top, ("source", "destination", "ack_mode", "reconnect_delay"), key,
                  "with {source, [...]}, the shovel's keys are source, destination, ack_mode and reconnect_delay")
        source, sline = top["source"]
        destination, dline = self.required(top, "destination", line, key)
        src = self.proplist(source, sline, f"{key}.source",
                            ("protocol", "uris", "declarations", "queue", "prefetch_count", "delete_after",
                             "consumer_args"))
        dest = self.proplist(destination, dline, f"{key}.destination",
                             ("protocol", "uris", "declarations", "publish_properties", "publish_fields",
                              "add_forward_headers", "add_timestamp_header"))
        self.protocol(src, f"{key}.source")
        self.protocol(dest, f"{key}.destination")
        src_key = f"{key}.source"
        queue, qline = self.required(src, "queue", sline, src_key)
        return self.build(
            top, src_uris=self.uris(*self.required(src, "uris", sline, src_key), f"{src_key}.uris"),
            dest_uris=self.uris(*self.required(dest, "uris", dline, f"{key}.destination"), f"{key}.destination.uris"),
            src_declarations=self.declarations(src, sline, src_key),
            dest_declarations=self.declarations(dest, dline, f"{key}.destination"),
            queue=self.queue(queue, qline, f"{src_key}.queue"), source=src, source_key=src_key,
            dest=dest, dest_key=f"{key}.destination", default_ack_mode="no_ack")

    def legacy(self, top: dict) -> Config:
        """rabbit_shovel_config:convert_from_legacy."""
        key, line = self.key, self.line
        if "destination" in top:
            self.fail(top["destination"][1], f"{key}.destination",
                      "a shovel with {destination, [...]} needs {source, [...]} too")
        sources, sline = self.required(top, "sources", line, key)
        destinations, dline = self.required(top, "destinations", line, key)
        queue, qline = self.required(top, "queue", line, key)
        ends = []
        for term, at, where in ((sources, sline, f"{key}.sources"), (destinations, dline, f"{key}.destinations")):
            props = self.proplist(term, at, where, ("broker", "brokers", "declarations"))
            if "brokers" in props:  # (RabbitMQ takes brokers when both are given)
                uris, uline = props["brokers"]
                if not isinstance(uris, list):
                    self.fail(uline, f"{where}.brokers", f"expected a list of URIs, got {format_term(uris)} "
                                                          "(RabbitMQ: require_list)")
                if not uris:
                    self.fail(uline, f"{where}.brokers", "expected a non-empty list of URIs "
                                                          "(RabbitMQ: expected_non_empty_list)")
                ends.append((self.uris(uris, uline, f"{where}.brokers"), self.declarations(props, at, where)))
            else:
                uri, uline = self.required(props, "broker", at, where)
                ends.append((self.uris([uri], uline, f"{where}.broker"), self.declarations(props, at, where)))
        (src_uris, src_declarations), (dest_uris, dest_declarations) = ends
        return self.build(top, src_uris=src_uris, dest_uris=dest_uris, src_declarations=src_declarations,
                          dest_declarations=dest_declarations, queue=self.queue(queue, qline, f"{key}.queue"),
                          source=top, source_key=key, dest=top, dest_key=key, default_ack_mode="on_confirm")

    def only(self, props: dict, allowed: tuple[str, ...], key: str, why: str) -> None:
        for name, (_, at) in props.items():
            if name not in allowed:
                self.fail(at, f"{key}.{name}", f"not a key of this format ({why})")

    def protocol(self, props: dict, key: str) -> None:
        if "protocol" not in props:
            return
        value, at = props["protocol"]
        if value == Atom("amqp10"):
            self.fail(at, f"{key}.protocol", "amqp10 is not supported: Warren's shovels speak AMQP 0-9-1 only")
        if value != Atom("amqp091"):
            self.fail(at, f"{key}.protocol", f"expected amqp091, got {format_term(value)}")

    def build(self, top: dict, *, src_uris, dest_uris, src_declarations, dest_declarations, queue, source: dict,
              source_key: str, dest: dict, dest_key: str, default_ack_mode: str) -> Config:
        """The Config from what both formats have read, and the keys they share."""
        key = self.key
        ack_mode = self.atom_of(top, "ack_mode", tuple(ACK_MODES), default_ack_mode, key)
        delete_after: Any = "never"
        if "delete_after" in source:
            value, at = source["delete_after"]
            if value == Atom("never") or value == Atom("queue-length"):
                delete_after = value.name
            elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                if ack_mode == "no_ack":
                    # (as a dynamic shovel: without acks, what it took past the count would be lost)
                    self.fail(at, f"{source_key}.delete_after", "a number needs ack_mode on_publish or "
                                                                "on_confirm (without acks, what the shovel "
                                                                "took past the count would be lost)")
                delete_after = value
            else:
                self.fail(at, f"{source_key}.delete_after",
                          f"expected never, 'queue-length' or a number of messages, got {format_term(value)}")
        prefetch = DEFAULT_PREFETCH
        if "prefetch_count" in source:
            value, at = source["prefetch_count"]
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535):
                self.fail(at, f"{source_key}.prefetch_count", f"expected an integer from 0 to 65535, got "
                                                              f"{format_term(value)} (RabbitMQ: "
                                                              "require_non_negative_integer)")
            prefetch = value
        reconnect_delay = DEFAULT_RECONNECT_DELAY
        if "reconnect_delay" in top:
            value, at = top["reconnect_delay"]
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                # (RabbitMQ restarts a shovel after N seconds for an integer N > 0, never otherwise)
                self.fail(at, f"{key}.reconnect_delay", "expected a number of seconds, an integer (0: the "
                                                        f"shovel is not restarted), got {format_term(value)}")
            reconnect_delay = value
        consumer_args: dict = {}
        if "consumer_args" in source:
            value, at = source["consumer_args"]
            consumer_args = self.table(value, at, f"{source_key}.consumer_args")
        fields = self.publish_fields(dest, dest_key)
        return Config(src_uris=src_uris, dest_uris=dest_uris, src_queue=queue, src_consumer_args=consumer_args,
                      dest_exchange=fields.get("exchange"), dest_exchange_key=fields.get("routing_key"),
                      ack_mode=ACK_MODES[ack_mode], delete_after=delete_after, prefetch=prefetch,
                      add_forward_headers=self.boolean(dest, "add_forward_headers", dest_key),
                      add_timestamp_header=self.boolean(dest, "add_timestamp_header", dest_key),
                      publish_properties=self.publish_properties(dest, dest_key),
                      reconnect_delay=reconnect_delay, static=True,
                      src_declarations=src_declarations, dest_declarations=dest_declarations)

    # --------------------------------------------------------------- values
    def atom_of(self, props: dict, name: str, allowed: tuple[str, ...], default: str, key: str) -> str:
        if name not in props:
            return default
        value, at = props[name]
        if not (isinstance(value, Atom) and value.name in allowed):
            self.fail(at, f"{key}.{name}", f"expected {', '.join(allowed[:-1])} or {allowed[-1]}, "
                                           f"got {format_term(value)}")
        return value.name

    def boolean(self, props: dict, name: str, key: str) -> bool:
        return self.atom_of(props, name, ("true", "false"), "false", key) == "true"

    def binary(self, value: Any, line: int, key: str, example: str) -> str:
        """A binary of at most 255 bytes (a name, a routing key: a shortstr), as text."""
        if not isinstance(value, bytes):
            string = " (a string: RabbitMQ needs a binary here)" if isinstance(value, str) else ""
            self.fail(line, key, f'expected a binary such as <<"{example}">>, got {format_term(value)}{string}')
        if len(value) > 255:
            self.fail(line, key, f"expected at most 255 bytes, got {len(value)}")
        return value.decode("utf-8", "surrogateescape")

    def queue(self, value: Any, line: int, key: str) -> str:
        # (RabbitMQ: require_binary; <<>> is the last queue the source's declarations declared)
        return self.binary(value, line, key, "my-queue")

    def uris(self, value: Any, line: int, key: str) -> tuple[str, ...]:
        if not (isinstance(value, list) and value):
            self.fail(line, key, f'expected a non-empty list of URIs such as ["amqp://"], got {format_term(value)}')
        out = []
        for uri in value:
            if not isinstance(uri, (str, bytes)):
                self.fail(line, key, f'expected a URI (a string such as "amqp://"), got {format_term(uri)}')
            text = uri if isinstance(uri, str) else uri.decode("utf-8", "surrogateescape")
            try:
                parse_uri(text)
            except UriError as err:
                self.fail(line, key, str(err.reason))  # (shovel.parse_uri: the validation text)
            out.append(text)
        return tuple(out)

    def publish_fields(self, props: dict, key: str) -> dict[str, str]:
        """basic.publish's fields the shovel sets: exchange and routing_key (ticket is
        ignored; mandatory and immediate only false: returns would go nowhere)."""
        if "publish_fields" not in props:
            return {}
        term, line = props["publish_fields"]
        where = f"{key}.publish_fields"
        fields = self.proplist(term, line, where, PUBLISH_FIELDS)
        out = {}
        for name, (value, at) in fields.items():
            if name in ("exchange", "routing_key"):
                out[name] = self.binary(value, at, f"{where}.{name}", "my-exchange" if name == "exchange" else "key")
            elif name == "ticket":
                if not (isinstance(value, int) and 0 <= value <= 65535):
                    self.fail(at, f"{where}.ticket", f"expected an integer from 0 to 65535, got {format_term(value)}")
            elif value != Atom("false"):
                self.fail(at, f"{where}.{name}", f"only false is supported (Warren's shovels publish without "
                                                 f"{name}), got {format_term(value)}")
        return out

    def publish_properties(self, props: dict, key: str) -> dict[str, Any]:
        """The P_basic fields the shovel sets on every message (as warren.broker.shovel's
        publish_properties; headers as an encoded field table)."""
        if "publish_properties" not in props:
            return {}
        term, line = props["publish_properties"]
        where = f"{key}.publish_properties"
        fields = self.proplist(term, line, where, tuple(PROPERTIES))
        out: dict[str, Any] = {}
        for name, (value, at) in fields.items():
            kind = PROPERTIES[name]
            if kind == "str":
                out[name] = self.binary(value, at, f"{where}.{name}", "text/plain" if name == "content_type" else "x")
            elif kind == "table":
                out[name] = encode_table(self.table(value, at, f"{where}.{name}"))
            else:
                high = 255 if kind == "octet" else 2 ** 64 - 1
                if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high):
                    self.fail(at, f"{where}.{name}", f"expected an integer from 0 to {high}, got {format_term(value)}")
                out[name] = value
        return out

    # --------------------------------------------------------- declarations
    def declarations(self, props: dict, line: int, key: str) -> tuple[spec.Method, ...]:
        """rabbit_amqp091_shovel:parse_declaration: 'queue.declare' or {'queue.declare',
        [{queue, <<"q">>}, durable, {arguments, [...]}]}, as AMQP methods."""
        if "declarations" not in props:
            return ()
        term, line = props["declarations"]
        where = f"{key}.declarations"
        if not isinstance(term, list):
            self.fail(line, where, f"expected a list of AMQP methods such as ['queue.declare'], got "
                                   f"{format_term(term)} (RabbitMQ: require_list)")
        return tuple(self.declaration(item, getattr(item, "line", 0) or line, where) for item in term)

    def declaration(self, item: Any, line: int, key: str) -> spec.Method:
        fields: Any
        if isinstance(item, Atom):
            method, fields = item, []
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom):
            method, fields = item
        else:
            self.fail(line, key, f"expected an AMQP method such as 'queue.declare' or {{'queue.declare', [...]}}, "
                                 f"got {format_term(item)}")
        name = method.name
        cls = DECLARATIONS.get(name)
        if cls is None:
            self.fail(line, key, f"{format_term(method)} is not a declaration Warren runs (those are "
                                 f"{', '.join(DECLARATIONS)})")
        where = f"{key}.{format_term(method)}"
        if not isinstance(fields, list):
            self.fail(line, where, f"expected a list of the method's fields such as [{{queue, <<\"q\">>}}, durable], "
                                   f"got {format_term(fields)} (RabbitMQ: expected_method_field_list)")
        kinds = dict(cls.FIELDS)  # (nowait: the shovel waits for each reply whatever it says)
        known = tuple(kinds)
        values: dict[str, Any] = dict(_DEFAULTS.get(name, {}))
        given = set()
        for field in fields:
            at = getattr(field, "line", 0) or line
            if isinstance(field, Atom):  # (a proplist's bare atom is {atom, true})
                fname, value = field.name, Atom("true")
            elif isinstance(field, tuple) and len(field) == 2 and isinstance(field[0], Atom):
                fname, value = field[0].name, field[1]
            else:
                self.fail(at, where, f"expected a field such as {{queue, <<\"q\">>}} or durable, got {format_term(field)}")
            if fname not in known:
                self.fail(at, where, f"unknown field {fname} (RabbitMQ: unknown_fields; {name} has "
                                     f"{', '.join(known)})")
            if fname in given:
                self.fail(at, f"{where}.{fname}", "given twice")
            given.add(fname)
            if fname == "nowait":
                self.boolean({"nowait": (value, at)}, "nowait", where)
                continue
            kind = kinds[fname]
            fkey = f"{where}.{fname}"
            if kind == "bit":
                values[fname] = self.boolean({fname: (value, at)}, fname, where)
            elif kind == "shortstr":
                values[fname] = self.binary(value, at, fkey, "x")
            elif kind == "table":
                values[fname] = self.table(value, at, fkey)
            elif not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 65535):  # ticket
                self.fail(at, fkey, f"expected an integer from 0 to 65535, got {format_term(value)}")
        missing = [f for f in _REQUIRED.get(name, ()) if f not in given]
        if missing:
            self.fail(line, where, f"{name} needs {' and '.join(missing)}")
        return cls(**values)

    # --------------------------------------------------------- field tables
    def table(self, term: Any, line: int, key: str) -> dict[str, Any]:
        """An AMQP field table as Erlang writes it, [{<<"x-message-ttl">>, long, 60000}], as
        the codec's values (typed integers keep their type)."""
        if not isinstance(term, list):
            self.fail(line, key, f'expected a table such as [{{<<"x-message-ttl">>, long, 60000}}], '
                                 f"got {format_term(term)}")
        out: dict[str, Any] = {}
        for item in term:
            at = getattr(item, "line", 0) or line
            if not (isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], bytes)):
                self.fail(at, key, f'expected a {{<<"name">>, Type, Value}} field, got {format_term(item)}')
            name = self.binary(item[0], at, key, "name")
            out[name] = self.value(item[1], item[2], at, f"{key}.{name}")
        return out

    def value(self, kind: Any, value: Any, line: int, key: str) -> Any:
        """One typed value of a field table or an array."""
        if not (isinstance(kind, Atom) and kind.name in TABLE_TYPES):
            self.fail(line, key, f"expected a field type ({', '.join(TABLE_TYPES)}), got {format_term(kind)}")
        name = kind.name
        if name in ("longstr", "binary"):
            if not isinstance(value, bytes):
                self.fail(line, key, f'expected a binary such as <<"text">> for a {name}, got {format_term(value)}')
            return value.decode("utf-8", "surrogateescape") if name == "longstr" else value
        if name == "bool":
            return self.boolean({"bool": (value, line)}, "bool", key)
        if name in _INT_RANGES or name == "timestamp":
            low, high = _INT_RANGES.get(name, (0, 2 ** 64 - 1))
            if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
                self.fail(line, key, f"expected an integer from {low} to {high} for a {name}, got {format_term(value)}")
            if name == "timestamp":
                try:
                    return datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
                except (OverflowError, ValueError, OSError):
                    self.fail(line, key, f"a timestamp of {value} seconds is past the year 9999")
            return typed_int(name, value)
        if name == "double":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                self.fail(line, key, f"expected a number for a double, got {format_term(value)}")
            return float(value)
        if name == "void":
            return None
        if name == "table":
            return self.table(value, line, key)
        if not isinstance(value, list):  # array
            self.fail(line, key, f"expected a list of {{Type, Value}} for an array, got {format_term(value)}")
        items = []
        for item in value:
            if not (isinstance(item, tuple) and len(item) == 2):
                self.fail(line, key, f"expected a {{Type, Value}} item in an array, got {format_term(item)}")
            items.append(self.value(item[0], item[1], line, key))
        return items
