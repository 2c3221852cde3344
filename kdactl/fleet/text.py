"""Text the fleet store keeps and the report prints: any value made into a bounded, printable string.

A hostname, a check name or a message comes from a document some node wrote; it may be of any type,
any length, and hold terminal escapes or bidi controls. ``clip`` turns it into at most ``limit``
characters with every control character spelled out, so one stored value can neither flood a report
nor rewrite the operator's terminal.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

ELLIPSIS = "…"
_CONTROL = ("Cc", "Cf", "Zl", "Zp")  # C0/C1 controls, bidi and other format characters, line separators


def as_text(value: Any) -> str:
    """A string as it is; anything else as compact JSON (lists and objects keep their shape)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def printable(text: str) -> str:
    return "".join(ch if unicodedata.category(ch) not in _CONTROL else f"\\u{ord(ch):04x}" for ch in text)


def clip(value: Any, limit: int) -> str:
    """``value`` as printable text of at most ``limit`` characters (cut ones end in an ellipsis)."""
    text = as_text(value)
    if len(text) > 4 * limit:  # spelling out controls grows the text at most 6x: cut first, cheaply
        text = text[: 4 * limit]
    text = printable(text)
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS
