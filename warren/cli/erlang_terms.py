"""The syntax of RabbitMQ's classic config file (rabbitmq.config, advanced.config): one Erlang
term ending with '.', read as Erlang would (atoms, quoted atoms, strings, binaries, integers
incl. `16#ff` and `$c`, floats, lists, tuples, `%` comments) into Python values: an Atom, an
ErlTuple, an ErlList (each with the line it starts on), str for a string, bytes for a binary,
int and float. What the terms mean is warren.cli.config's (and warren.cli.static_shovels')."""

import re

from ..amqp.erlang import erl_atom, erl_binary, erl_string


class Atom:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Atom) and other.name == self.name

    def __hash__(self):
        return hash((Atom, self.name))

    def __repr__(self):
        return format_term(self)


class ErlTuple(tuple):
    """A tuple term; .line is where its `{` is."""
    line = 0


class ErlList(list):
    """A list term; .line is where its `[` is."""
    line = 0


class ErlangSyntaxError(ValueError):
    """A syntax error in an Erlang term; .line is where."""

    def __init__(self, line, message):
        super().__init__(message)
        self.line = line


_ESCAPES = {"b": 8, "d": 127, "e": 27, "f": 12, "n": 10, "r": 13, "s": 32, "t": 9, "v": 11}
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\f\v]+) | (?P<nl>\n) | (?P<comment>%[^\n]*)
  | (?P<float>[0-9](?:_?[0-9])*\.[0-9](?:_?[0-9])*(?:[eE][+-]?[0-9]+)?)
  | (?P<based>[0-9]+\#[0-9A-Za-z_]+)
  | (?P<int>[0-9](?:_?[0-9])*)
  | (?P<atom>[a-z][A-Za-z0-9_@]*)
  | (?P<var>[A-Z_][A-Za-z0-9_@]*)
  | (?P<dot>\.(?=[\s%]|\Z))
  | (?P<punct><<|>>|[\[\]{},|/+\-\#])
""", re.VERBOSE)


def _tokens(text: str):
    """(kind, value, line) tuples, ending with ("eof", None, line)."""
    pos, line, end = 0, 1, len(text)
    while pos < end:
        ch = text[pos]
        if ch in "\"'":
            value, pos, newlines = _quoted(text, pos, line)
            yield ("string" if ch == '"' else "atom"), value, line
            line += newlines
            continue
        if ch == "$":
            if pos + 1 >= end:
                raise ErlangSyntaxError(line, "unterminated character literal")
            if text[pos + 1] == "\\":
                value, pos = _escape(text, pos + 2, line)
            else:
                value, pos = text[pos + 1], pos + 2
            yield "number", ord(value), line
            continue
        if text.startswith("#{", pos):
            raise ErlangSyntaxError(line, "maps (#{...}) are not supported in a config file")
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ErlangSyntaxError(line, f"unexpected character '{ch}'")
        kind, value = m.lastgroup, m.group()
        pos = m.end()
        if kind == "nl":
            line += 1
        elif kind in ("ws", "comment"):
            continue
        elif kind == "float":
            yield "number", float(value.replace("_", "")), line
        elif kind == "int":
            yield "number", int(value.replace("_", "")), line
        elif kind == "based":
            base, digits = value.split("#")
            try:
                if not 2 <= int(base) <= 36:
                    raise ValueError
                yield "number", int(digits.replace("_", ""), int(base)), line
            except ValueError:
                raise ErlangSyntaxError(line, f"bad integer '{value}'") from None
        elif kind == "var":
            raise ErlangSyntaxError(line, f"unexpected variable '{value}' (a config file holds data only; "
                                     "atoms start with a lowercase letter or are quoted)")
        else:
            yield kind if kind != "punct" else value, value, line
    yield "eof", None, line


def _escape(text: str, pos: int, line: int):
    """The character of the escape sequence after a backslash at pos-1, and the next position."""
    if pos >= len(text):
        raise ErlangSyntaxError(line, "unterminated escape sequence")
    ch = text[pos]
    if ch in "01234567":
        m = re.compile(r"[0-7]{1,3}").match(text, pos)
        assert m is not None  # text[pos] is an octal digit
        return chr(int(m.group(), 8)), m.end()
    if ch == "x":
        m = re.compile(r"x(?:\{([0-9A-Fa-f]+)\}|([0-9A-Fa-f]{2}))").match(text, pos)
        if not m:
            raise ErlangSyntaxError(line, "bad \\x escape sequence")
        return chr(int(m.group(1) or m.group(2), 16)), m.end()
    if ch == "^" and pos + 1 < len(text):
        return chr(ord(text[pos + 1]) & 31), pos + 2
    if ch in _ESCAPES:
        return chr(_ESCAPES[ch]), pos + 1
    return ch, pos + 1


def _quoted(text: str, pos: int, line: int):
    """A "string" or 'atom' starting at pos: (value, next position, newlines inside)."""
    out: list[str]
    quote, out, i, newlines = text[pos], [], pos + 1, 0
    while True:
        if i >= len(text):
            raise ErlangSyntaxError(line, "unterminated " + ("string" if quote == '"' else "quoted atom"))
        ch = text[i]
        if ch == quote:
            return "".join(out), i + 1, newlines
        if ch == "\\":
            ch, i = _escape(text, i + 1, line + newlines)
            out.append(ch)
            continue
        if ch == "\n":
            newlines += 1
        out.append(ch)
        i += 1


class _Parser:
    def __init__(self, text: str):
        self.tokens = list(_tokens(text))
        self.pos = 0

    def peek(self):
        return self.tokens[self.pos]

    def take(self, kind=None):
        token = self.tokens[self.pos]
        if kind is not None and token[0] != kind:
            raise ErlangSyntaxError(token[2], f"expected '{kind}' but found {self.describe(token)}")
        self.pos += 1
        return token

    @staticmethod
    def describe(token):
        kind, value, _ = token
        if kind == "eof":
            return "the end of the file"
        if kind == "dot":
            return "'.'"
        if kind == "string":
            return f'"{value}"'
        return f"'{value}'"

    def document(self):
        term = self.term()
        self.take("dot")
        token = self.peek()
        if token[0] != "eof":
            raise ErlangSyntaxError(token[2], f"expected the end of the file after the term's '.' "
                                         f"but found {self.describe(token)}")
        return term

    def term(self):
        kind, value, line = token = self.take()
        if kind == "number":
            return value
        if kind == "atom":
            return Atom(value)
        if kind == "string":
            while self.peek()[0] == "string":  # "ab" "cd" is "abcd"
                value += self.take()[1]
            return value
        if kind in ("-", "+") and self.peek()[0] == "number":
            number = self.take()[1]
            return -number if kind == "-" else number
        if kind == "[":
            return self.sequence(ErlList(), "]", line)
        if kind == "{":
            items = self.sequence([], "}", line)
            result = ErlTuple(items)
            result.line = line
            return result
        if kind == "<<":
            return self.binary(line)
        if kind == "#":
            raise ErlangSyntaxError(line, "maps (#{...}) are not supported in a config file")
        raise ErlangSyntaxError(line, f"expected a term but found {self.describe(token)}")

    def sequence(self, items, close, line):
        if isinstance(items, ErlList):
            items.line = line
        if self.peek()[0] == close:
            self.take()
            return items
        while True:
            items.append(self.term())
            kind, _, at = token = self.take()
            if kind == close:
                return items
            if kind == "|" and close == "]":
                raise ErlangSyntaxError(at, "improper lists ([H | T]) are not supported in a config file")
            if kind != ",":
                raise ErlangSyntaxError(at, f"expected ',' or '{close}' but found {self.describe(token)}")

    def binary(self, line):
        out = bytearray()
        if self.peek()[0] == ">>":
            self.take()
            return bytes(out)
        while True:
            kind, value, at = token = self.take()
            if kind == "string":
                while self.peek()[0] == "string":
                    value += self.take()[1]
            elif kind != "number" or not isinstance(value, int):
                raise ErlangSyntaxError(at, "expected a string or an integer in a binary but found "
                                            + self.describe(token))
            utf8 = False
            if self.peek()[0] == "/":
                self.take()
                spec = self.take("atom")
                if spec[1] != "utf8":
                    raise ErlangSyntaxError(at, f"unsupported binary segment type '/{spec[1]}' (only /utf8 is)")
                utf8 = True
            chars = [ord(c) for c in value] if kind == "string" else [value]
            for c in chars:
                if utf8:
                    out += chr(c).encode("utf-8")
                else:
                    out.append(c & 0xFF)  # as Erlang: an 8-bit segment keeps the low byte
            kind, _, at = token = self.take()
            if kind == ">>":
                return bytes(out)
            if kind != ",":
                raise ErlangSyntaxError(at, f"expected ',' or '>>' but found {self.describe(token)}")


def parse_erlang_term(text: str):
    """The single term of an Erlang config file (ending with '.'); ErlangSyntaxError (with the
    line) if it is not one."""
    return _Parser(text).document()


def format_term(term) -> str:
    """A term as Erlang would print it (for error messages)."""
    if isinstance(term, Atom):
        return erl_atom(term.name)
    if isinstance(term, bytes):
        return erl_binary(term, printable="unicode").decode()
    if isinstance(term, str):
        return erl_string(term)
    if isinstance(term, tuple):
        return "{" + ",".join(format_term(t) for t in term) + "}"
    if isinstance(term, list):
        return "[" + ",".join(format_term(t) for t in term) + "]"
    return repr(term)
