"""erlang:phash2/1 over the Erlang terms RabbitMQ hashes where the hash shows.

RabbitMQ names a binding with arguments by "routing key ~ hash" where the hash is
phash2(Args, 2^32) of the binding's argument table as Erlang holds it: a list of
{Key :: binary, Type :: atom, Value} tuples; its consistent-hash exchange places a message by
phash2 of its routing key (or of a header's {Type, Value}, or of a property). So that the
properties_key values and the queue a key lands on are the ones RabbitMQ gives, this is a port
of ERTS's make_hash2 (the portable, documented-stable hash) for lists, tuples, atoms,
binaries, integers and floats.
"""

import struct

_M = 0xFFFFFFFF
_HCONST = 0x9E3779B9


def _hc(n: int) -> int:
    return (_HCONST * n) & _M


_HC2, _HC3, _HC4, _HC9, _HC10, _HC11, _HC12, _HC13 = (_hc(n) for n in (2, 3, 4, 9, 10, 11, 12, 13))
_NIL_DEF = 2  # ERTS' tag value for [] (mixed in when [] is not the whole term)
_NIL_HASH = 3468870702  # phash2([]) itself


class Atom(str):
    """An Erlang atom (a plain str is hashed as a binary)."""

    __slots__ = ()


def _atom_hash(name: str) -> int:
    # hashpjw over the atom's text, as ERTS' atom table computes it
    h = 0
    for v in name.encode("latin-1"):
        h = ((h << 4) + v) & _M
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
            h ^= g
    return h


def _hash2(e1: int, e2: int, const: int, h: int) -> int:
    return _mix3((const + e1) & _M, (const + e2) & _M, h)[2]


def _block_hash(data: bytes, initval: int) -> int:
    a = b = _HCONST
    c = initval
    n = len(data)
    i = 0
    while n - i >= 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & _M
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & _M
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & _M
        a, b, c = _mix3(a, b, c)
        i += 12
    tail = data[i:] + bytes(12 - (n - i))
    c = (c + n) & _M
    a = (a + int.from_bytes(tail[0:4], "little")) & _M
    b = (b + int.from_bytes(tail[4:8], "little")) & _M
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M  # the low byte of c holds the length
    return _mix3(a, b, c)[2]


def _mix3(a, b, c):
    # Bob Jenkins' mix, on 32-bit unsigned values
    a = (a - b - c) & _M; a ^= c >> 13
    b = (b - c - a) & _M; b ^= (a << 8) & _M
    c = (c - a - b) & _M; c ^= b >> 13
    a = (a - b - c) & _M; a ^= c >> 12
    b = (b - c - a) & _M; b ^= (a << 16) & _M
    c = (c - a - b) & _M; c ^= b >> 5
    a = (a - b - c) & _M; a ^= c >> 3
    b = (b - c - a) & _M; b ^= (a << 10) & _M
    c = (c - a - b) & _M; c ^= b >> 15
    return a, b, c


def _is_byte(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255


def phash2(term) -> int:
    """erlang:phash2(Term) (= phash2(Term, 2^32)). Terms: list, tuple, Atom, bool (an atom),
    None (the atom undefined), bytes/str (a binary; str as UTF-8), int, float."""
    h = 0
    stack = []
    while True:
        t = term
        if isinstance(t, list) and t:
            c = sh = 0
            i = 0
            at_element = True
            while _is_byte(t[i]):  # ERTS hashes runs of small integers 0..255 four at a time
                sh = ((sh << 8) + t[i]) & _M
                if c == 3:
                    h = _hash2(sh, 0, _HC4, h)
                    c = sh = 0
                else:
                    c += 1
                i += 1
                if i == len(t):
                    at_element = False
                    break
            if c > 0:
                h = _hash2(sh, 0, _HC4, h)
            if at_element:
                stack.append(t[i + 1:])
                term = t[i]
            else:
                term = []
            continue
        if isinstance(t, tuple):
            h = _hash2(len(t), 0, _HC9, h)
            if t:
                stack.extend(reversed(t[1:]))
                term = t[0]
                continue
        elif isinstance(t, list):  # []
            h = _NIL_HASH if h == 0 else _hash2(_NIL_DEF, 0, _HC2, h)
        elif isinstance(t, Atom) or isinstance(t, bool) or t is None:
            name = t if isinstance(t, Atom) else ("undefined" if t is None else ("true" if t else "false"))
            ah = _atom_hash(name)
            h = ah if h == 0 else _hash2(ah, 0, _HC3, h)
        elif isinstance(t, (bytes, bytearray, str)):
            data = t.encode() if isinstance(t, str) else bytes(t)
            con = (_HC13 + h) & _M
            h = _block_hash(data, con) if data else con
        elif isinstance(t, int):
            if -(1 << 27) <= t < (1 << 27):
                if t < 0:
                    h = _hash2((-t) & _M, 0, _HCONST, h)  # negative numbers are mixed twice
                h = _hash2(t & _M, 0, _HCONST, h)
            else:
                const = _HC10 if t < 0 else _HC11
                v = abs(t)
                while True:
                    digit = v & 0xFFFFFFFFFFFFFFFF
                    h = _hash2(digit & _M, digit >> 32, const, h)
                    v >>= 64
                    if not v:
                        break
        elif isinstance(t, float):
            bits = struct.unpack("<Q", struct.pack("<d", t if t != 0.0 else 0.0))[0]
            h = _hash2(bits >> 32, bits & _M, _HC12, h)
        else:
            raise TypeError(f"cannot hash {type(t).__name__}")
        if not stack:
            return h
        term = stack.pop()
