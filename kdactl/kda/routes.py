"""Route selection: a pure function of the problem's shape and layout and the device's facts.

Each route has an eligibility rule that returns None (eligible: it can run the problem) or the
reason it cannot; ``preference`` orders the routes by measured speed for the problem's shape. The
selector takes the first eligible route in that order and reports why it passed over the others. A
forced route that is not eligible raises ValueError with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

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


Rule = Callable[[KdaProblem, DeviceInfo], Optional[str]]


def _direct(p: KdaProblem, dev: DeviceInfo) -> Optional[str]:
    return None  # the token-serial route runs every valid problem


def _chunk(p: KdaProblem, dev: DeviceInfo) -> Optional[str]:
    if p.key_dim != p.value_dim:
        return f"needs K == V, got K={p.key_dim} V={p.value_dim}"
    return None  # validation already limits K and V to 64 or 128


RULES: dict[str, Rule] = {
    "direct": _direct,
    "chunk": _chunk,
}
ROUTES: tuple[str, ...] = tuple(RULES)

# The chunked route takes sequences that average at least one chunk. Measured on the H200
# (csrc/PERF.md): at B4 H8 it beats direct from T = 16 on (0.012 vs 0.025 ms; 0.037 vs 0.238 ms at
# T = 256); below one chunk nothing was measured and the single-launch direct route stays.
CHUNK_MIN_TOKENS = 16


def tokens_per_sequence(p: KdaProblem) -> float:
    """Mean tokens per sequence: the shape fact that decides between the routes (varlen lengths are
    on the device, and routing must not synchronize)."""
    return p.batch * p.seqlen / p.num_seqs if p.num_seqs else 0.0


def preference(p: KdaProblem, dev: DeviceInfo) -> tuple[tuple[str, str], ...]:
    """Every route, fastest first, each with why it ranks where it does."""
    tps = tokens_per_sequence(p)
    if tps >= CHUNK_MIN_TOKENS:
        why = f"{tps:.0f} tokens per sequence >= {CHUNK_MIN_TOKENS}"
        return ("chunk", why), ("direct", f"slower than chunk at {why}")
    why = f"{tps:.0f} tokens per sequence < {CHUNK_MIN_TOKENS}"
    return ("direct", why), ("chunk", f"slower than direct at {why}")


def eligibility(problem: KdaProblem, device: DeviceInfo) -> dict[str, Optional[str]]:
    """route -> None when eligible, else the reason it is not."""
    return {name: rule(problem, device) for name, rule in RULES.items()}


def decide_route(problem: KdaProblem, device: DeviceInfo, route: str = "auto") -> RouteDecision:
    """The route to run, with the reason for every route passed over."""
    verdicts = eligibility(problem, device)
    if route != "auto":
        if route not in RULES:
            raise ValueError(f"kdactl.kda.prefill: route must be 'auto' or one of {ROUTES}, got {route!r}")
        if verdicts[route] is not None:
            raise ValueError(f"kdactl.kda.prefill: route {route!r} is not eligible: {verdicts[route]}")
        return RouteDecision(route, {r: "not requested" for r in RULES if r != route})
    rejected: dict[str, str] = {}
    chosen = None
    for name, why in preference(problem, device):
        if verdicts[name] is not None:
            rejected[name] = verdicts[name]
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
