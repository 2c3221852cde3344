"""Route selection: a pure function of the problem's shape and layout and the device's facts.

Each route has an eligibility rule that returns None (eligible) or the reason it is not; the
selector takes the first eligible route in order of preference and reports why it passed over the
others. A forced route that is not eligible raises ValueError with that reason.
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


# In order of preference: the first eligible route wins.
RULES: dict[str, Rule] = {
    "direct": _direct,
}
ROUTES: tuple[str, ...] = tuple(RULES)


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
    for name, reason in verdicts.items():
        if reason is None:
            return RouteDecision(name, rejected)
        rejected[name] = reason
    raise ValueError(f"kdactl.kda.prefill: no route can run this problem: {rejected}")


def select_route(problem: KdaProblem, device: DeviceInfo, route: str = "auto") -> str:
    """The SPEC's route selector: the name of the route that ``prefill`` runs for this problem."""
    return decide_route(problem, device, route).route
