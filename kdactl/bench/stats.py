"""Statistics of timed blocks: the median of block medians, min, max, spread; geometric means.

A block is a run of consecutive timed iterations of one candidate inside the counterbalanced
schedule (order.py). The median of block medians resists both single outliers and a slow drift
(clocks, temperature) that a plain median over all samples would mix into one candidate only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None when there are none (or any is not positive)."""
    vals = list(values)
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class Summary:
    median_ms: float  # median of the block medians
    min_ms: float  # fastest single iteration
    max_ms: float  # slowest single iteration
    block_lo_ms: float  # fastest block median
    block_hi_ms: float  # slowest block median
    samples: int
    blocks: int

    @property
    def spread(self) -> float:
        """Relative range of the block medians: how far this run disagrees with itself."""
        return (self.block_hi_ms - self.block_lo_ms) / self.median_ms if self.median_ms > 0 else float("inf")

    def to_json(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms,
                "block_lo_ms": self.block_lo_ms, "block_hi_ms": self.block_hi_ms,
                "spread": self.spread, "samples": self.samples, "blocks": self.blocks}  # fmt: skip


def summarize(blocks: Sequence[Sequence[float]]) -> Summary:
    """Summary of a candidate's blocks (each a list of iteration times in ms)."""
    blocks = [list(b) for b in blocks if len(b)]
    if not blocks:
        raise ValueError("no timed samples")
    flat = [t for b in blocks for t in b]
    if any(not (math.isfinite(t) and t >= 0) for t in flat):
        raise ValueError(f"bad timing sample among {flat[:8]}...")
    medians = [median(b) for b in blocks]
    return Summary(median(medians), min(flat), max(flat), min(medians), max(medians), len(flat), len(blocks))
