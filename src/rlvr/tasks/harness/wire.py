"""Plain values on the wire between the code-scoring judge and the candidate's process.

A value crosses the process boundary as JSON with tags, and is rebuilt on the other side from the
tags alone, so what the judge compares is always a plain Python value built by the judge's own
(pristine) interpreter, never an object of the candidate's making: an ``__eq__`` that always answers
True, a ``str`` subclass or a patched builtin cannot cross.

=====================  ==========================================
value                  JSON
=====================  ==========================================
None, bool, str        itself
int                    itself; ``{"$i": hex}`` beyond 2**63
float                  itself; ``{"$f": "nan" | "inf" | "-inf"}``
list                   array
tuple                  ``{"$t": [...]}``
dict                   ``{"$d": [[key, value], ...]}``
set, frozenset         ``{"$s": [...]}``, ``{"$fs": [...]}``
bytes, bytearray       ``{"$b": hex}``, ``{"$ba": hex}``
complex                ``{"$c": [real, imag]}``
fractions.Fraction     ``{"$q": [numerator, denominator]}``
decimal.Decimal        ``{"$m": str}``
range                  ``{"$r": [start, stop, step]}``
an object handle       ``{"$h": int}`` (the candidate keeps the object; see the judge)
=====================  ==========================================

The encoder converts subclasses of the plain types (a namedtuple, an ``OrderedDict``, an ``IntEnum``)
to the base type; anything else is :class:`NotPlain` unless ``handle`` is given. The decoder accepts
only the table above, to a depth of :data:`MAX_DEPTH`, and raises :class:`BadWire` for anything else.

Interpretation: this file runs in three places — imported by rlvr's tests, and inlined as source into
the judge and the candidate programs inside the sandbox (which cannot import rlvr) — so it uses the
standard library only and defines nothing at import time but functions and constants.
"""

import decimal as _decimal
import fractions as _fractions
import json as _json
import math as _math

MAX_DEPTH = 100
"""Deepest nesting of containers either side encodes or accepts."""

_BIG = 1 << 63


class NotPlain(TypeError):
    """A value that is not one of the wire's plain types (and no handle was allowed)."""


class BadWire(ValueError):
    """A message that does not decode to plain values (bad JSON, an unknown tag, too deep, too big)."""


def encode(value, handle=None, _depth=0):
    """``value`` as tagged JSON-able data (see the module table).

    Args:
        value: any Python value.
        handle: called with an object that is not plain, returns its handle number; ``None`` raises.

    Raises:
        NotPlain: an object outside the table and no ``handle``; or nesting deeper than ``MAX_DEPTH``.
    """
    if _depth > MAX_DEPTH:
        raise NotPlain("the value is nested deeper than %d levels" % MAX_DEPTH)
    d = _depth + 1
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        v = int.__index__(value)
        return v if -_BIG < v < _BIG else {"$i": format(v, "x")}
    if isinstance(value, float):
        v = float.__float__(value)
        return v if _math.isfinite(v) else {"$f": repr(v)}
    if isinstance(value, list):
        return [encode(x, handle, d) for x in list.__getitem__(value, slice(None))]
    if isinstance(value, tuple):
        return {"$t": [encode(x, handle, d) for x in tuple.__getitem__(value, slice(None))]}
    if isinstance(value, dict):
        return {"$d": [[encode(k, handle, d), encode(v, handle, d)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"$fs": [encode(x, handle, d) for x in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"$s": [encode(x, handle, d) for x in set.__iter__(value)]}
    if isinstance(value, bytes):
        return {"$b": bytes.hex(value)}
    if isinstance(value, bytearray):
        return {"$ba": bytearray.hex(value)}
    if isinstance(value, complex):
        return {"$c": [encode(value.real, None, d), encode(value.imag, None, d)]}
    if type(value) is _fractions.Fraction:
        return {"$q": [encode(value.numerator, None, d), encode(value.denominator, None, d)]}
    if type(value) is _decimal.Decimal:
        return {"$m": str(value)}
    if type(value) is range:
        return {"$r": [encode(value.start, None, d), encode(value.stop, None, d), encode(value.step, None, d)]}
    if handle is None:
        raise NotPlain("an object of type %s is not a plain value" % type(value).__name__)
    return {"$h": int(handle(value))}


def _hashable(v):
    try:
        hash(v)
    except TypeError:
        raise BadWire("an unhashable %s as a set member or dict key" % type(v).__name__) from None
    return v


def _int(v):
    if type(v) is not int:
        raise BadWire("expected an integer, got %s" % type(v).__name__)
    return v


def _float(v):
    if type(v) is int:
        return float(v)
    if type(v) is not float:
        raise BadWire("expected a number, got %s" % type(v).__name__)
    return v


def _hex(v):
    if type(v) is not str:
        raise BadWire("expected a hex string")
    try:
        return bytes.fromhex(v)
    except ValueError:
        raise BadWire("not a hex string") from None


def decode(data, handle=None, _depth=0):
    """The plain value tagged JSON ``data`` stands for (inverse of :func:`encode`).

    Args:
        data: what ``json.loads`` returned.
        handle: called with a handle number, returns the object it names; ``None`` rejects handles.

    Raises:
        BadWire: an unknown tag, a malformed tagged value, a handle where none is allowed, nesting
            deeper than ``MAX_DEPTH``.
    """
    if _depth > MAX_DEPTH:
        raise BadWire("nested deeper than %d levels" % MAX_DEPTH)
    d = _depth + 1
    t = type(data)
    if data is None or t is bool or t is str or t is int or t is float:
        return data
    if t is list:
        return [decode(x, handle, d) for x in data]
    if t is not dict or len(data) != 1:
        raise BadWire("a JSON object must hold exactly one known tag")
    (tag, v), = data.items()
    if tag in ("$t", "$s", "$fs", "$c", "$q", "$r", "$d") and type(v) is not list:
        raise BadWire("tag %s needs a list" % tag)
    if tag == "$i":
        if type(v) is not str:
            raise BadWire("tag $i needs a hex string")
        try:
            return int(v, 16)
        except ValueError:
            raise BadWire("tag $i needs a hex string") from None
    if tag == "$f":
        if v not in ("nan", "inf", "-inf"):
            raise BadWire("tag $f needs nan, inf or -inf")
        return float(v)
    if tag == "$t":
        return tuple(decode(x, handle, d) for x in v)
    if tag == "$d":
        out = {}
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise BadWire("tag $d needs [key, value] pairs")
            out[_hashable(decode(pair[0], handle, d))] = decode(pair[1], handle, d)
        return out
    if tag == "$s":
        return {_hashable(decode(x, handle, d)) for x in v}
    if tag == "$fs":
        return frozenset(_hashable(decode(x, handle, d)) for x in v)
    if tag == "$b":
        return _hex(v)
    if tag == "$ba":
        return bytearray(_hex(v))
    if tag == "$c":
        if len(v) != 2:
            raise BadWire("tag $c needs [real, imag]")
        return complex(_float(decode(v[0], None, d)), _float(decode(v[1], None, d)))
    if tag == "$q":
        if len(v) != 2 or decode(v[1], None, d) == 0:
            raise BadWire("tag $q needs [numerator, denominator != 0]")
        return _fractions.Fraction(_int(decode(v[0], None, d)), _int(decode(v[1], None, d)))
    if tag == "$m":
        if type(v) is not str or len(v) > 1000:
            raise BadWire("tag $m needs a decimal string")
        try:
            return _decimal.Decimal(v)
        except _decimal.InvalidOperation:
            raise BadWire("tag $m needs a decimal string") from None
    if tag == "$r":
        if len(v) != 3 or decode(v[2], None, d) == 0:
            raise BadWire("tag $r needs [start, stop, step != 0]")
        return range(*(_int(decode(x, None, d)) for x in v))
    if tag == "$h":
        if handle is None or type(v) is not int:
            raise BadWire("an object handle where only plain values are allowed")
        return handle(v)
    raise BadWire("unknown tag %r" % (tag,))


def dumps(value, handle=None):
    """:func:`encode` then compact JSON bytes (NaN never appears: it is tagged)."""
    return _json.dumps(encode(value, handle), separators=(",", ":"), allow_nan=False).encode()


def loads(raw, handle=None):
    """JSON bytes back to a plain value; every failure is :class:`BadWire` (RecursionError included)."""
    try:
        data = _json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise BadWire("not JSON: %s" % type(exc).__name__) from None
    try:
        return decode(data, handle)
    except RecursionError:
        raise BadWire("nested too deeply") from None
