"""Which of route small_bh's segments started warm and which were stitched (or, in a sequence of at most
SMALL_BH_MAX_UNSTITCHED segments, walked without a stitch), read back from a call's
workspace: the prepare pass stores log2 of a bound on every (chunk, head)'s state map there, and the
recurrence decides each segment's start from those bounds (``warm_start`` in csrc/kda_chunk.cuh, which
``warm_start`` here follows step for step). kdactl bench reports it beside small_bh's plan, so that a
timing says whether its segments ran from a decay bound, from exact stitching or in one longer walk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdactl.kda.problem import KdaProblem
from kdactl.kda.routes import DeviceInfo, chunk_slots, small_bh_halves, small_bh_plan
from kdactl.kernel_abi import CHUNK, ROUTE_IDS, SMALL_BH_MAX_UNSTITCHED

DROP_LOG2 = -20.0  # csrc/kda_chunk.cuh kDropLog2: the dropped history at most 2^-20 of the state
WARM_CHUNKS = 32  # kWarmChunks: the most chunks a segment walks back before it needs its stitched start
MIN_HALVED_CHUNKS = 4  # kMinHalvedChunks: a shorter known segment is walked whole


@dataclass(frozen=True)
class SegmentStarts:
    warm: int  # from a zero state a few chunks early (or from the sequence's start): no stitch
    stitched: int  # from the exact state the stitch made
    # not warm in a sequence small_bh does not stitch: fixed layouts then run route chunk's whole walks,
    # a varlen batch the walk of the segment before it on through it
    walked_on: int = 0
    halved: int = 0  # known segments (segment 0s included) walked in two halves at once (small_bh_halves)
    # the most chunks a warm start walks before its segment's first (to the sequence's start where it reaches it)
    longest_walk: int = 0

    def __str__(self) -> str:
        total = self.warm + self.stitched + self.walked_on
        walk = f", up to {self.longest_walk} chunk{'s' * (self.longest_walk != 1)} back" if self.longest_walk else ""
        text = f"{self.warm} of {total} segment starts warm (decay bound{walk}), {self.stitched} stitched"
        text += f", {self.walked_on} walked without a stitch" if self.walked_on else ""
        return text + (f"; {self.halved} segments walked in two halves" if self.halved else "")


def warm_start(log2_bound: Sequence[float], first: int) -> int | None:
    """The chunk a segment starting at chunk ``first`` of its sequence walks from (0: the sequence's
    start; c > 0: chunks c .. first - 1 bound the dropped history to 2^DROP_LOG2), or None when it
    needs its stitched start. ``log2_bound[c]``: chunk c's bound, as the prepare pass stored it."""
    if first == 0:
        return 0
    total = 0.0
    for w in range(WARM_CHUNKS):
        c = first - 1 - w
        if c <= 0:
            return 0
        total += log2_bound[c]
        if total <= DROP_LOG2:
            return c
    return None


def segment_starts(
    log2_bounds: Sequence[Sequence[float]], lengths: Sequence[int], segment_chunks: int, halves: bool = False
) -> SegmentStarts:
    """Warm, stitched and walked-on starts over every sequence (``lengths``, in tokens, in order), head and
    segment after the first, from the bounds [chunk slot][head]: sequence n's chunk c in slot bos_n / CHUNK
    + n + c. A start that is not warm is stitched where its sequence has more than SMALL_BH_MAX_UNSTITCHED
    segments, else walked on. With ``halves`` (the call's small_bh_halves), a known segment of a stitched
    sequence whose middle chunk starts warm too is counted as walked in two halves."""
    warm = stitched = walked_on = halved = longest_walk = bos = 0
    heads = len(log2_bounds[0]) if len(log2_bounds) else 0
    for n, length in enumerate(lengths):
        slot0, chunks = bos // CHUNK + n, -(-length // CHUNK)
        unstitched = -(-chunks // segment_chunks) <= SMALL_BH_MAX_UNSTITCHED
        for h in range(heads):
            column = [log2_bounds[slot0 + c][h] for c in range(chunks)]
            for first in range(0, chunks, segment_chunks):
                start = warm_start(column, first)
                known = start is not None
                if first > 0:
                    warm += known
                    if start is not None:
                        longest_walk = max(longest_walk, first - start)
                    walked_on += not known and unstitched
                    stitched += not known and not unstitched
                end = min(chunks, first + segment_chunks)
                if halves and known and not unstitched and end - first >= MIN_HALVED_CHUNKS:
                    halved += warm_start(column, first + (end - first + 1) // 2) is not None
        bos += length
    return SegmentStarts(warm, stitched, walked_on, halved, longest_walk)


def bounds_offset(p: KdaProblem, dev: DeviceInfo, workspace_bytes=None) -> int:
    """Where small_bh's bounds start in its workspace: after the prepared blocks, whose size is the
    chunk route's whole workspace for the same problem (``workspace_bytes(route_id, args)``: the
    library's own rule, kdactl.kda.device.kernels() by default)."""
    from kdactl.kda.launch import args_template

    if workspace_bytes is None:
        from kdactl.kda.device import kernels

        workspace_bytes = kernels().workspace_bytes
    chunk = ROUTE_IDS["chunk"]
    return workspace_bytes(chunk, args_template(p, dev, chunk, 1.0))


def read_log2_bounds(workspace: torch.Tensor, p: KdaProblem, offset: int) -> list[list[float]]:
    """The bounds a small_bh call left in its workspace (uint8) from ``offset``, [slot][head] on the host."""
    slots = chunk_slots(p)
    raw = workspace[offset : offset + 4 * slots * p.heads].view(torch.float32).reshape(slots, p.heads)
    return raw.cpu().tolist()


def starts_of_call(workspace: torch.Tensor, p: KdaProblem, dev: DeviceInfo, lengths: Sequence[int]) -> SegmentStarts:
    """How the segments of the small_bh call that last used ``workspace`` started."""
    bounds = read_log2_bounds(workspace, p, bounds_offset(p, dev))
    return segment_starts(bounds, lengths, small_bh_plan(p, dev).segment_chunks, small_bh_halves(p, dev))
