"""The route registry and route selection: a pure function of the problem's shape and layout and
the device's facts.

ROUTE_TABLE holds one record per kernel route, in the order of kdactl.kernel_abi.ROUTES: its id is
the route's index in the C library's table (KDACTL_ROUTES in csrc/kdactl_api.h), which the loader
compares with ROUTES.

Each route has an eligibility rule that returns None (eligible: it can run the problem) or the
reason it cannot; ``preference`` orders the routes by measured speed for the problem's shape. The
selector takes the first eligible route in that order and reports why it passed over the others. A
forced route that is not eligible raises ValueError with that reason.

No torch here: the bench options read the route names where torch must not load.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kdactl.kernel_abi import CHUNK, ROUTE_IDS, ROUTES, SMALL_BH_CTAS_PER_SM, SMALL_BH_MAX_UNSTITCHED

if TYPE_CHECKING:
    from kdactl.kda.problem import KdaProblem


@dataclass(frozen=True)
class DeviceInfo:
    """What routing needs to know about the GPU."""

    sm_count: int
    cc: tuple[int, int]
    target: str  # the kernel target the library was built for, e.g. "sm_90a"


@dataclass(frozen=True)
class RouteDecision:
    route: str
    rejected: dict[str, str] = field(default_factory=dict)  # route -> reason it was passed over

    @property
    def id(self) -> int:
        """The route's id in the kernel library's route table."""
        return ROUTE_IDS[self.route]


Rule = Callable[["KdaProblem", DeviceInfo], str | None]


def _direct(p: KdaProblem, dev: DeviceInfo) -> str | None:
    return None  # the token-serial route runs every valid problem


def _chunk(p: KdaProblem, dev: DeviceInfo) -> str | None:
    if p.key_dim != p.value_dim:
        return f"needs K == V, got K={p.key_dim} V={p.value_dim}"
    return None  # validation already limits K and V to 64 or 128


# Route small_bh (csrc/kda_small_bh.cu) cuts every sequence into segments and runs the chunk route's
# recurrence on all of them at once: a reduction pass (a CTA per segment, head and 64 value columns that
# walks a warm-started segment whole, two for one that is stitched: its end state from zero and its state
# map), a short stitch, and a replay pass. The CTAs take 4 warps and 77 KB of shared memory each, 2 to an
# SM (SMALL_BH_CTAS_PER_SM, as csrc/kda_small_bh.cu asserts). As many segments as fill those slots once
# with one CTA per segment: where every segment starts warm that is the whole recurrence, one wave of
# segments half as long as a cut for the reduction's two CTAs per segment would give; where they are
# stitched, the reduction takes two waves and the replay one, both of those shorter segments.
# H200, tools/small_bh_segments.py --two-ctas, lower-bound gate, the plan for two CTAs per segment against
# this one (ms, FlashKDA's draw, warm / fla's test draw, stitched): B1 T32768 H12 0.747 -> 0.591 / 1.221
# -> 1.034, B1 T65536 H8 0.967 -> 0.760 / 1.623 -> 1.361. At least SMALL_BH_MIN_SEGMENT chunks each, and at most
# sqrt(chunks / 2) segments: the stitch costs about 3 us per segment against about 1 us per chunk of the
# recurrence passes, so a stitched time ~ 2 L + 3 P over P segments of L = chunks / P chunks (B1 T1024
# H1 with 32 segments of 2 chunks measured 0.116 ms, chunk 0.046).
SMALL_BH_MIN_SEGMENT = 2


@dataclass(frozen=True)
class SegmentPlan:
    segments: int  # per sequence (varlen: of the whole batch); fewer than 2 means the route is not eligible
    segment_chunks: int  # chunks per segment (the last one may be shorter)
    lanes: int  # recurrence CTAs per segment index: sequences x heads x value slices (varlen: heads x slices)


def small_bh_slots(dev: DeviceInfo) -> int:
    """The recurrence CTAs small_bh's passes fit on the device at once (SMALL_BH_CTAS_PER_SM an SM)."""
    return SMALL_BH_CTAS_PER_SM * dev.sm_count


def small_bh_plan(p: KdaProblem, dev: DeviceInfo) -> SegmentPlan:
    """How route small_bh would cut this problem's sequences (what the C launcher is given). A varlen
    batch is cut as if its sequences were one: its lengths are on the device, and segments of one
    length cut a long sequence into many and leave short ones whole (balanced by tokens)."""
    chunks = -(-p.seqlen // CHUNK)
    lanes = (1 if p.varlen else p.num_seqs) * p.heads * max(1, p.value_dim // 64)
    wanted = small_bh_slots(dev) // lanes if lanes else 0
    segments = min(wanted, chunks // SMALL_BH_MIN_SEGMENT, max(2, math.isqrt(chunks // 2)))
    if segments < 2:
        return SegmentPlan(max(segments, 0), chunks, lanes)
    seg_chunks = -(-chunks // segments)
    return SegmentPlan(-(-chunks // seg_chunks), seg_chunks, lanes)


def chunk_slots(p: KdaProblem) -> int:
    """The workspace's chunk slots (csrc num_slots): sequence n's chunk c lives in slot bos_n / CHUNK + n + c."""
    rows = p.seqlen if p.varlen else p.batch * p.seqlen
    return rows // CHUNK + p.num_seqs


def small_bh_halves(p: KdaProblem, dev: DeviceInfo) -> bool:
    """Whether small_bh's reduction, where it has an M slot beside every unit (sequences of more than
    SMALL_BH_MAX_UNSTITCHED segments), fits its slots in one wave: then a known segment's idle M slot walks
    the segment's second half (csrc Segments::halves, set by the launcher on the same count of units)."""
    plan = small_bh_plan(p, dev)
    if plan.segments < 2:
        return False
    units = -(-chunk_slots(p) // plan.segment_chunks) + p.num_seqs if p.varlen else plan.segments  # csrc unit_count
    return 2 * units * plan.lanes <= small_bh_slots(dev)


def route_detail(p: KdaProblem, dev: DeviceInfo, route: str) -> str:
    """How ``route`` cuts this problem, where it cuts it (small_bh's segments); "" for the others.
    Whether a segment then starts warm (the decay bound) or is stitched is decided on the device, and
    so, for a fixed layout of at most SMALL_BH_MAX_UNSTITCHED segments, whether they run at all."""
    if route != "small_bh":
        return ""
    plan = small_bh_plan(p, dev)
    per = "over the batch's tokens" if p.varlen else "per sequence"
    lanes = f"{plan.lanes} lane" if plan.lanes == 1 else f"{plan.lanes} lanes"
    detail = f"{plan.segments} segments of {plan.segment_chunks} chunks {per}, {lanes}"
    if not p.varlen and plan.segments <= SMALL_BH_MAX_UNSTITCHED:
        detail += " (where one does not start warm, chunk's walks of whole sequences run instead)"
    return detail


def _small_bh(p: KdaProblem, dev: DeviceInfo) -> str | None:
    if p.key_dim != p.value_dim:
        return f"needs K == V, got K={p.key_dim} V={p.value_dim}"
    plan = small_bh_plan(p, dev)
    if plan.segments >= 2:
        return None
    if -(-p.seqlen // CHUNK) < 2 * SMALL_BH_MIN_SEGMENT:
        return f"needs {2 * SMALL_BH_MIN_SEGMENT} chunks of {CHUNK} tokens (two segments), got T={p.seqlen}"
    return (f"N x H = {p.num_seqs * p.heads} already fills the GPU ({plan.lanes} recurrence CTAs a segment "
            f"for {small_bh_slots(dev)} slots on {dev.sm_count} SMs): no room for segments")  # fmt: skip


def _no_segments(p: KdaProblem, dev: DeviceInfo) -> int:
    return 0


def _small_bh_segment_chunks(p: KdaProblem, dev: DeviceInfo) -> int:
    return small_bh_plan(p, dev).segment_chunks


@dataclass(frozen=True)
class Route:
    """One kernel route. Its C side is entry ``id`` of KDACTL_ROUTES (csrc/kdactl_api.h): the
    launcher kdactl_kda_<name> and the workspace size rule kdactl_<name>_workspace_bytes, which
    Python asks through kdactl_kda_workspace_bytes(route id)."""

    name: str
    id: int
    rule: Rule  # None when the route can run the problem, else the reason it cannot
    segment_chunks: Callable[[KdaProblem, DeviceInfo], int] = _no_segments  # kdactl_kda_args.segment_chunks


ROUTE_TABLE: tuple[Route, ...] = (
    Route("direct", ROUTE_IDS["direct"], _direct),
    Route("chunk", ROUTE_IDS["chunk"], _chunk),
    Route("small_bh", ROUTE_IDS["small_bh"], _small_bh, segment_chunks=_small_bh_segment_chunks),
)

# The chunked route takes sequences that average at least one chunk. Measured on the H200
# (docs/routes/direct.md): at B4 H8 it beats direct from T = 16 on (0.012 vs 0.025 ms; 0.037 vs 0.238 ms at
# T = 256); below one chunk nothing was measured and the single-launch direct route stays.
CHUNK_MIN_TOKENS = 16


def tokens_per_sequence(p: KdaProblem) -> float:
    """Mean tokens per sequence: the shape fact that decides between the routes (varlen lengths are
    on the device, and routing must not synchronize)."""
    return p.batch * p.seqlen / p.num_seqs if p.num_seqs else 0.0


# small_bh takes over from chunk once the sequences average SMALL_BH_MIN_TOKENS tokens and its plan cuts
# SMALL_BH_MIN_SEGMENTS segments per sequence (stitched where they do not start warm), or, in a fixed
# layout, 2 to SMALL_BH_MAX_UNSTITCHED (not stitched: the segments at once where every one starts warm,
# else chunk's own walks, decided on the device). Measured on the H200 (docs/routes/small_bh.md), chunk /
# small_bh ms under the lower-bound gate, where every segment starts warm (FlashKDA's draw) / where every
# one is stitched (fla's test draw): 5 segments, B1 T4096 H24 0.259 / 0.175 and 0.259 / 0.304, B1 T32768
# H24 1.931 / 1.095 and 1.923 / 1.884. Earlier (before the plan's one CTA per segment per slot): B1 T512
# H4 0.033 / 0.034, B1 T256 H1 0.022 / 0.026. Below 5 segments (H100, auto on small_bh / chunk): warm B1
# T8192 H64 0.645 / 0.731, B1 T8192 H32 0.343 / 0.496; cold 0.765 / 0.734 and 0.517 / 0.497.
SMALL_BH_MIN_SEGMENTS = 5
SMALL_BH_MIN_TOKENS = 1024


def preference(p: KdaProblem, dev: DeviceInfo) -> tuple[tuple[str, str], ...]:
    """Every route, fastest first, each with why it ranks where it does."""
    tps = tokens_per_sequence(p)
    if tps < CHUNK_MIN_TOKENS:
        why = f"{tps:.0f} tokens per sequence < {CHUNK_MIN_TOKENS}"
        return ("direct", why), ("chunk", f"slower than direct at {why}"), ("small_bh", f"slower than direct at {why}")
    why = f"{tps:.0f} tokens per sequence >= {CHUNK_MIN_TOKENS}"
    plan = small_bh_plan(p, dev)
    segments, slots = plan.segments, small_bh_slots(dev)
    per = "over the batch" if p.varlen else "per sequence"
    if p.varlen and p.num_seqs * plan.lanes > slots:
        # chunk walks every sequence at once: with a CTA per slot already, cutting the long ones gains
        # nothing (serving lengths, H200: H24 0.356 / 0.350 warm, 0.357 / 0.460 stitched; H16, 192
        # CTAs, 0.326 / 0.241 and 0.327 / 0.313; one 16384-token sequence among four short ones at H16
        # 1.370 / 0.444 and 1.368 / 0.762)
        seg_why = f"{p.num_seqs} sequences x {plan.lanes} lanes fill the {slots} recurrence slots already"
    elif tps < SMALL_BH_MIN_TOKENS:
        seg_why = f"{tps:.0f} tokens per sequence < {SMALL_BH_MIN_TOKENS}"
    elif segments >= SMALL_BH_MIN_SEGMENTS or (not p.varlen and segments >= 2):
        seg_why = (
            f"{segments} segments {per} >= {SMALL_BH_MIN_SEGMENTS}"
            if segments >= SMALL_BH_MIN_SEGMENTS
            else f"{segments} segments {per} <= {SMALL_BH_MAX_UNSTITCHED}, walked at once where all start warm"
        )
        return (
            ("small_bh", seg_why),
            ("chunk", f"slower than small_bh at {seg_why}"),
            ("direct", f"slower than chunk at {why}"),
        )
    else:
        seg_why = f"{segments} segments {per} < {SMALL_BH_MIN_SEGMENTS}"
    return ("chunk", why), ("small_bh", f"slower than chunk at {seg_why}"), ("direct", f"slower than chunk at {why}")


def eligibility(problem: KdaProblem, device: DeviceInfo) -> dict[str, str | None]:
    """route -> None when eligible, else the reason it is not."""
    return {r.name: r.rule(problem, device) for r in ROUTE_TABLE}


def decide_route(problem: KdaProblem, device: DeviceInfo, route: str = "auto") -> RouteDecision:
    """The route to run, with the reason for every route passed over. A pure function of plain
    data, so it is remembered: a serving engine repeats a few shapes, and this runs on every call."""
    if not isinstance(route, str):
        raise ValueError(f"kdactl.kda.prefill: route must be 'auto' or one of {ROUTES}, got {route!r}")
    return _decide_route(problem, device, route)


@functools.lru_cache(maxsize=4096)
def _decide_route(problem: KdaProblem, device: DeviceInfo, route: str) -> RouteDecision:
    verdicts = eligibility(problem, device)
    if route != "auto":
        if route not in verdicts:
            raise ValueError(f"kdactl.kda.prefill: route must be 'auto' or one of {ROUTES}, got {route!r}")
        if verdicts[route] is not None:
            raise ValueError(f"kdactl.kda.prefill: route {route!r} is not eligible: {verdicts[route]}")
        return RouteDecision(route, {r: "not requested" for r in ROUTES if r != route})
    rejected: dict[str, str] = {}
    chosen = None
    for name, why in preference(problem, device):
        verdict = verdicts[name]
        if verdict is not None:
            rejected[name] = verdict
        elif chosen is None:
            chosen = name
        else:
            rejected[name] = why
    if chosen is not None:
        return RouteDecision(chosen, rejected)
    raise ValueError(f"kdactl.kda.prefill: no route can run this problem: {rejected}")


def select_route(problem: KdaProblem, device: DeviceInfo, route: str = "auto") -> str:
    """The SPEC's route selector: the name of the route that ``prefill`` runs for this problem."""
    return decide_route(problem, device, route).route
