"""RFC 8785 JSON Canonicalization Scheme (JCS): the one byte form of a JSON value that any language
can reproduce, so a certificate's digest can be checked outside Python.

- Objects: members sorted by their names as UTF-16 code units (not code points: a name with a
  character above U+FFFF sorts by its surrogates, before U+E000..U+FFFF); no whitespace.
- Numbers: IEEE 754 doubles written as ECMAScript's Number::toString writes them (ECMA-262
  7.1.12.1): the shortest digits that read back as the same double, ``0`` for ``-0`` and ``0.0``,
  exponent form below 1e-6 and from 1e21 (``1e-7``, ``1e+21``). Integers must be exactly
  representable (magnitude at most 2**53 - 1, as I-JSON requires); others are refused.
- Strings: UTF-8; only ``"``, ``\\`` and the controls below U+0020 are escaped: ``\\b \\t \\n \\f \\r``
  by name, the others as ``\\u00xx`` in lower-case hex.

Stdlib only: ``kdactl gate`` digests the certificate with it.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_SAFE_INTEGER = 2**53 - 1


class NotCanonicalizable(ValueError):
    """A value JCS cannot represent (a NaN or infinite float, an integer beyond 2**53 - 1, a key
    that is not a string, a non-JSON type); the message names its JSON path."""

    def __init__(self, what: str, path: str = "") -> None:
        super().__init__(f"{path.lstrip('.') or 'the document'} {what}")
        self.what, self.path = what, path


def canonicalize(value: Any) -> bytes:
    out: list[str] = []
    _write(value, out)
    return "".join(out).encode("utf-8")


def number_text(x: float) -> str:
    """ECMAScript Number::toString of a finite double. Python's repr already gives the shortest
    round-tripping digits (and, among those, the closest to the value, as ECMA-262 asks); only
    where the decimal point goes and how the exponent is written differ."""
    if not math.isfinite(x):
        raise NotCanonicalizable(f"is {x!r}, not a JSON number")
    if x == 0:
        return "0"  # -0 too
    sign = "-" if x < 0 else ""
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    lead = len(whole + frac) - len((whole + frac).lstrip("0"))  # zeros of 0.00ddd
    digits = (whole + frac)[lead:].rstrip("0")
    n = len(whole) - lead + int(exp or 0)  # x = 0.digits * 10**n: ECMA-262's s, k and n
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{head}e{'+' if e >= 0 else '-'}{abs(e)}"


# json's own string encoder without ensure_ascii (C where available) escapes exactly JCS's set: '"',
# '\\', \b \t \n \f \r by name and the other controls below U+0020 as lower-case \u00xx.
_string = json.encoder.encode_basestring


def _sorted_names(obj: dict) -> list[str]:
    # code point order is UTF-16 order unless a name holds a character above U+FFFF (its surrogates
    # sort below U+E000..U+FFFF): ASCII names, the usual case, take the fast sort
    if all(map(str.isascii, obj)):
        return sorted(obj)
    return sorted(obj, key=lambda name: name.encode("utf-16-be", "surrogatepass"))


def _write(value: Any, out: list[str]) -> None:
    """Appends value's JCS text to out. The JSON path of a refused value is added on the way out
    (not built for every value: the certificate's digest is computed on every gate)."""
    kind = type(value)
    if kind is str:
        out.append(_string(value))
    elif kind is float:
        out.append(number_text(value))
    elif value is None or value is True or value is False:
        out.append("null" if value is None else "true" if value else "false")
    elif kind is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise NotCanonicalizable(f"is {value}: integers beyond 2**53 - 1 are not I-JSON")
        out.append(str(value))
    elif kind is dict:
        if not all(type(k) is str for k in value):
            raise NotCanonicalizable("has a key that is not a string")
        out.append("{")
        for i, name in enumerate(_sorted_names(value)):
            out.append(',"' if i else '"')
            out.append(_string(name)[1:])
            out.append(":")
            try:
                _write(value[name], out)
            except NotCanonicalizable as err:
                raise NotCanonicalizable(err.what, f".{name}{err.path}") from None
        out.append("}")
    elif kind is list or kind is tuple:
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            try:
                _write(item, out)
            except NotCanonicalizable as err:
                raise NotCanonicalizable(err.what, f"[{i}]{err.path}") from None
        out.append("]")
    else:
        raise NotCanonicalizable(f"is a {kind.__name__}, not a JSON value (or a subclass of one)")
