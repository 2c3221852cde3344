"""Named tuning options: a kernel variant that a benchmark or tuning tool forces, never auto.

``Tuning(warps=8, stages=4)`` asks the chunked routes' recurrence for CTAs of 8 warps with 4 chunks in
flight; a field left 0 stays the launcher's choice (``AUTO``: every field). The text form
``warps=8,stages=4`` (or ``auto``) is what the tuning tools take on their command lines. A forced
shape the route does not build (8 warps at V = 64, or with 8 stages; small_bh's other than its
planned 4 warps and 4 stages) is refused by the launcher with a ValueError naming ``tuning``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

WARPS = (2, 4, 8)  # 16 value columns each: 8 warps span all 128 values of a head
STAGES = (4, 8)  # chunks in flight: the recurrence waits on the latency of its loads
AUTO_TEXT = "auto"
_CHOICES = {"warps": WARPS, "stages": STAGES}


@dataclass(frozen=True)
class Tuning:
    """The chunked routes' recurrence shape, forced (kdactl_kda_args.tuning_warps, tuning_stages)."""

    warps: int = 0  # one of WARPS, or 0: the launcher's choice
    stages: int = 0  # one of STAGES, or 0: the launcher's choice

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if type(value) is not int or (value != 0 and value not in choices):
                raise ValueError(f"tuning: {name} must be one of {', '.join(map(str, choices))}, "
                                 f"or 0 for the launcher's choice; got {value!r}")  # fmt: skip

    def __str__(self) -> str:
        """The text form ``parse`` reads: ``warps=8,stages=4``, or ``auto``."""
        given = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name)]
        return ",".join(given) or AUTO_TEXT

    @classmethod
    def parse(cls, text: str) -> Tuning:
        """``warps=W,stages=S`` (either may be left out) or ``auto``; ValueError naming what is wrong."""
        text = text.strip()
        if text == AUTO_TEXT:
            return AUTO
        options: dict[str, int] = {}
        for item in text.split(","):
            name, eq, value = (part.strip() for part in item.partition("="))
            if not eq or name not in _CHOICES:
                raise ValueError(f"tuning {text!r}: {item.strip()!r} is not NAME=VALUE with NAME one of "
                                 f"{', '.join(_CHOICES)} (e.g. warps=8,stages=4, or {AUTO_TEXT})")  # fmt: skip
            if name in options:
                raise ValueError(f"tuning {text!r}: {name} is given twice")
            try:
                options[name] = int(value)
            except ValueError:
                raise ValueError(f"tuning {text!r}: {name} must be an integer, got {value!r}") from None
        return cls(**options)


AUTO = Tuning()


def tuning_argument(text: str) -> Tuning:
    """``Tuning.parse`` as an argparse ``type``: its message, not argparse's "invalid value"."""
    try:
        return Tuning.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
