"""AMQP 0-9-1 methods (with RabbitMQ's extensions) and their field codecs.

Each method is a small class generated from the table below, so a method reads like the
spec: `QueueDeclare(queue="q", durable=True)`. Rare methods go through the generic codec
here; the hot path (publish, deliver, ack) has hand-written codecs in `fastpath`.
"""

import struct
from typing import TYPE_CHECKING, Any, ClassVar, cast

from .codec import (
    DecodeError,
    decode_table,
    encode_table,
    longstr,
    MalformedUTF8,
    read_longstr_raw,
    read_shortstr,
    shortstr,
)

_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_HH = struct.Struct(">HH")

# (class_id, method_id, ClassName, has_content, [(field, type), ...])
_SPEC: list[tuple[int, int, str, bool, list[tuple[str, str]]]] = [
    (10, 10, "ConnectionStart", False, [("version_major", "octet"), ("version_minor", "octet"),
     ("server_properties", "table"), ("mechanisms", "longstr"), ("locales", "longstr")]),
    (10, 11, "ConnectionStartOk", False, [("client_properties", "table"), ("mechanism", "shortstr"),
     ("response", "longstr"), ("locale", "shortstr")]),
    (10, 20, "ConnectionSecure", False, [("challenge", "longstr")]),
    (10, 21, "ConnectionSecureOk", False, [("response", "longstr")]),
    (10, 30, "ConnectionTune", False, [("channel_max", "short"), ("frame_max", "long"), ("heartbeat", "short")]),
    (10, 31, "ConnectionTuneOk", False, [("channel_max", "short"), ("frame_max", "long"), ("heartbeat", "short")]),
    (10, 40, "ConnectionOpen", False, [("virtual_host", "shortstr"), ("capabilities", "shortstr"), ("insist", "bit")]),
    (10, 41, "ConnectionOpenOk", False, [("known_hosts", "shortstr")]),
    (10, 50, "ConnectionClose", False, [("reply_code", "short"), ("reply_text", "shortstr"),
     ("class_id", "short"), ("method_id", "short")]),
    (10, 51, "ConnectionCloseOk", False, []),
    (10, 60, "ConnectionBlocked", False, [("reason", "shortstr")]),
    (10, 61, "ConnectionUnblocked", False, []),
    (10, 70, "ConnectionUpdateSecret", False, [("new_secret", "longstr"), ("reason", "shortstr")]),
    (10, 71, "ConnectionUpdateSecretOk", False, []),
    (20, 10, "ChannelOpen", False, [("out_of_band", "shortstr")]),
    (20, 11, "ChannelOpenOk", False, [("channel_id", "longstr")]),
    (20, 20, "ChannelFlow", False, [("active", "bit")]),
    (20, 21, "ChannelFlowOk", False, [("active", "bit")]),
    (20, 40, "ChannelClose", False, [("reply_code", "short"), ("reply_text", "shortstr"),
     ("class_id", "short"), ("method_id", "short")]),
    (20, 41, "ChannelCloseOk", False, []),
    (40, 10, "ExchangeDeclare", False, [("ticket", "short"), ("exchange", "shortstr"), ("type", "shortstr"),
     ("passive", "bit"), ("durable", "bit"), ("auto_delete", "bit"), ("internal", "bit"), ("nowait", "bit"),
     ("arguments", "table")]),
    (40, 11, "ExchangeDeclareOk", False, []),
    (40, 20, "ExchangeDelete", False, [("ticket", "short"), ("exchange", "shortstr"), ("if_unused", "bit"),
     ("nowait", "bit")]),
    (40, 21, "ExchangeDeleteOk", False, []),
    (40, 30, "ExchangeBind", False, [("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
     ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")]),
    (40, 31, "ExchangeBindOk", False, []),
    (40, 40, "ExchangeUnbind", False, [("ticket", "short"), ("destination", "shortstr"), ("source", "shortstr"),
     ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")]),
    (40, 51, "ExchangeUnbindOk", False, []),
    (50, 10, "QueueDeclare", False, [("ticket", "short"), ("queue", "shortstr"), ("passive", "bit"),
     ("durable", "bit"), ("exclusive", "bit"), ("auto_delete", "bit"), ("nowait", "bit"), ("arguments", "table")]),
    (50, 11, "QueueDeclareOk", False, [("queue", "shortstr"), ("message_count", "long"), ("consumer_count", "long")]),
    (50, 20, "QueueBind", False, [("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
     ("routing_key", "shortstr"), ("nowait", "bit"), ("arguments", "table")]),
    (50, 21, "QueueBindOk", False, []),
    (50, 30, "QueuePurge", False, [("ticket", "short"), ("queue", "shortstr"), ("nowait", "bit")]),
    (50, 31, "QueuePurgeOk", False, [("message_count", "long")]),
    (50, 40, "QueueDelete", False, [("ticket", "short"), ("queue", "shortstr"), ("if_unused", "bit"),
     ("if_empty", "bit"), ("nowait", "bit")]),
    (50, 41, "QueueDeleteOk", False, [("message_count", "long")]),
    (50, 50, "QueueUnbind", False, [("ticket", "short"), ("queue", "shortstr"), ("exchange", "shortstr"),
     ("routing_key", "shortstr"), ("arguments", "table")]),
    (50, 51, "QueueUnbindOk", False, []),
    (60, 10, "BasicQos", False, [("prefetch_size", "long"), ("prefetch_count", "short"), ("global_", "bit")]),
    (60, 11, "BasicQosOk", False, []),
    (60, 20, "BasicConsume", False, [("ticket", "short"), ("queue", "shortstr"), ("consumer_tag", "shortstr"),
     ("no_local", "bit"), ("no_ack", "bit"), ("exclusive", "bit"), ("nowait", "bit"), ("arguments", "table")]),
    (60, 21, "BasicConsumeOk", False, [("consumer_tag", "shortstr")]),
    (60, 30, "BasicCancel", False, [("consumer_tag", "shortstr"), ("nowait", "bit")]),
    (60, 31, "BasicCancelOk", False, [("consumer_tag", "shortstr")]),
    (60, 40, "BasicPublish", True, [("ticket", "short"), ("exchange", "shortstr"), ("routing_key", "shortstr"),
     ("mandatory", "bit"), ("immediate", "bit")]),
    (60, 50, "BasicReturn", True, [("reply_code", "short"), ("reply_text", "shortstr"), ("exchange", "shortstr"),
     ("routing_key", "shortstr")]),
    (60, 60, "BasicDeliver", True, [("consumer_tag", "shortstr"), ("delivery_tag", "longlong"),
     ("redelivered", "bit"), ("exchange", "shortstr"), ("routing_key", "shortstr")]),
    (60, 70, "BasicGet", False, [("ticket", "short"), ("queue", "shortstr"), ("no_ack", "bit")]),
    (60, 71, "BasicGetOk", True, [("delivery_tag", "longlong"), ("redelivered", "bit"), ("exchange", "shortstr"),
     ("routing_key", "shortstr"), ("message_count", "long")]),
    (60, 72, "BasicGetEmpty", False, [("cluster_id", "shortstr")]),
    (60, 80, "BasicAck", False, [("delivery_tag", "longlong"), ("multiple", "bit")]),
    (60, 90, "BasicReject", False, [("delivery_tag", "longlong"), ("requeue", "bit")]),
    (60, 100, "BasicRecoverAsync", False, [("requeue", "bit")]),
    (60, 110, "BasicRecover", False, [("requeue", "bit")]),
    (60, 111, "BasicRecoverOk", False, []),
    (60, 120, "BasicNack", False, [("delivery_tag", "longlong"), ("multiple", "bit"), ("requeue", "bit")]),
    (85, 10, "ConfirmSelect", False, [("nowait", "bit")]),
    (85, 11, "ConfirmSelectOk", False, []),
    (90, 10, "TxSelect", False, []),
    (90, 11, "TxSelectOk", False, []),
    (90, 20, "TxCommit", False, []),
    (90, 21, "TxCommitOk", False, []),
    (90, 30, "TxRollback", False, []),
    (90, 31, "TxRollbackOk", False, []),
]

_DEFAULTS: dict[str, Any] = {"octet": 0, "short": 0, "long": 0, "longlong": 0, "shortstr": "",
                             "longstr": b"", "bit": False, "table": None}


class Method:
    """Base of the generated method classes."""

    __slots__ = ()
    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()
    HAS_CONTENT: ClassVar[bool] = False

    def __init__(self, **kwargs: Any) -> None:
        for field, kind in self.FIELDS:
            setattr(self, field, kwargs.pop(field, _DEFAULTS[kind]))
        if kwargs:
            raise TypeError(f"unknown fields for {self.NAME}: {sorted(kwargs)}")

    def __repr__(self):
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f, _ in self.FIELDS)
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, f) == getattr(other, f) for f, _ in self.FIELDS)


BY_ID: dict[int, type[Method]] = {}


def _dotted(class_name: str) -> str:
    # "QueueDeclareOk" -> "queue.declare-ok", the spelling RabbitMQ's error texts use.
    import re
    words = re.findall(r"[A-Z][a-z]*", class_name)
    return words[0].lower() + "." + "-".join(w.lower() for w in words[1:])


for _cid, _mid, _cls_name, _content, _fields in _SPEC:
    _cls = cast("type[Method]", type(_cls_name, (Method,), {
        "__slots__": tuple(f for f, _ in _fields),
        "CLASS_ID": _cid, "METHOD_ID": _mid, "NAME": _dotted(_cls_name),
        "FIELDS": tuple(_fields), "HAS_CONTENT": _content,
    }))
    globals()[_cls_name] = _cls
    BY_ID[(_cid << 16) | _mid] = _cls

if TYPE_CHECKING:
    # The method classes (ConnectionStart, ..., TxRollbackOk) are made from _SPEC above, the
    # one place that lists them: to mypy, every name this module does not define otherwise is
    # one of them. (Their fields are set from keyword arguments, so a call type-checks as
    # Method(**kwargs) does; a misspelt name is not caught by mypy but fails when it runs.)
    def __getattr__(name: str) -> type[Method]: ...


class UnknownMethod(DecodeError):
    pass


class BadTable(DecodeError):
    """A field table whose content does not parse (the arguments around it do)."""

    def __init__(self, method_name: str, reason: str):
        super().__init__(f"{method_name}: {reason}")
        self.method_name = method_name
        self.reason = reason


def decode_method(payload) -> Method:
    """Decode a method frame payload (class id, method id, fields)."""
    if len(payload) < 4:
        raise DecodeError("method frame too short")
    class_id, method_id = _HH.unpack_from(payload, 0)
    cls = BY_ID.get((class_id << 16) | method_id)
    if cls is None:
        raise UnknownMethod(f"unknown method {class_id}.{method_id}")
    method = cls.__new__(cls)
    pos = 4
    bit_byte = bit_pos = 0
    in_bits = False
    # As RabbitMQ: the arguments' layout is checked first (501 "cannot decode"), then, in
    # argument order, shortstrs for UTF-8 and field tables for their content.
    invalid: DecodeError | None = None
    try:
        for field, kind in cls.FIELDS:
            if kind == "bit":
                if not in_bits or bit_pos == 8:
                    bit_byte = payload[pos]
                    pos += 1
                    bit_pos = 0
                    in_bits = True
                setattr(method, field, bool(bit_byte & (1 << bit_pos)))
                bit_pos += 1
                continue
            in_bits = False
            if kind == "shortstr":
                value, pos = read_shortstr(payload, pos)
                if invalid is None and not value.isascii() and not _is_utf8(value):
                    invalid = MalformedUTF8("shortstr is not valid UTF-8")
            elif kind == "short":
                (value,) = _H.unpack_from(payload, pos)
                pos += 2
            elif kind == "long":
                (value,) = _I.unpack_from(payload, pos)
                pos += 4
            elif kind == "longlong":
                (value,) = _Q.unpack_from(payload, pos)
                pos += 8
            elif kind == "octet":
                value = payload[pos]
                pos += 1
            elif kind == "table":
                raw, pos = read_longstr_raw(payload, pos)
                value = None
                if invalid is None:
                    try:
                        value = decode_table(raw, strict=True)
                    except MalformedUTF8 as err:
                        invalid = err
                    except DecodeError as err:
                        invalid = BadTable(cls.NAME, str(err))
            else:  # longstr
                value, pos = read_longstr_raw(payload, pos)
            setattr(method, field, value)
    except (struct.error, IndexError):
        raise DecodeError(f"truncated {cls.NAME} fields") from None
    if pos != len(payload):
        raise DecodeError(f"{len(payload) - pos} bytes after the {cls.NAME} fields")
    if invalid is not None:
        raise invalid
    return method


def _is_utf8(text: str) -> bool:
    """False for a shortstr read_shortstr decoded with lone surrogates (bytes not UTF-8)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def encode_method(method: Method) -> bytes:
    parts = [_HH.pack(method.CLASS_ID, method.METHOD_ID)]
    bit_byte = bit_pos = 0
    in_bits = False
    for field, kind in method.FIELDS:
        value = getattr(method, field)
        if kind == "bit":
            if in_bits and bit_pos == 8:
                parts.append(bytes((bit_byte,)))
                bit_byte = bit_pos = 0
            in_bits = True
            if value:
                bit_byte |= 1 << bit_pos
            bit_pos += 1
            continue
        if in_bits:
            parts.append(bytes((bit_byte,)))
            bit_byte = bit_pos = 0
            in_bits = False
        if kind == "shortstr":
            parts.append(shortstr(value))
        elif kind == "short":
            parts.append(_H.pack(value))
        elif kind == "long":
            parts.append(_I.pack(value))
        elif kind == "longlong":
            parts.append(_Q.pack(value))
        elif kind == "octet":
            parts.append(bytes((value,)))
        elif kind == "table":
            parts.append(encode_table(value))
        else:
            parts.append(longstr(value))
    if in_bits:
        parts.append(bytes((bit_byte,)))
    return b"".join(parts)
