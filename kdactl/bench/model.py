"""The plain data a benchmark run passes around, and the Harness protocol that hides the GPU.

Everything that touches torch or CUDA sits behind ``Harness`` (real adapter: harness.py), so the
runner, statistics, gate and reports are tested on the CPU with a fake harness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kdactl.bench.host import HostCost
from kdactl.bench.stats import Summary
from kdactl.bench.suites import Shape
from kdactl.reference import ERROR_LIMIT

# Candidate kinds: "auto" and "route" are kdactl's own kernels (their failure is evidence against the
# node); "peer" is another library, timed for comparison only.
OWN_KINDS = ("auto", "route")

# The other libraries `--peers` names (adapters: peers.py).
PEERS = ("fla", "flashkda", "cudnn")

# Outcome statuses.
OK, FAILED, ERROR, REJECTED, UNAVAILABLE = "ok", "failed", "error", "rejected", "unavailable"

# A peer over the SPEC's error ratio limit but within this one is still timed, its time marked: the
# public kernels' own accuracy sits near the limit on these inputs (FlashKDA's measured 5.7e-3 and
# 6.3e-3 on the H200, cuDNN's 4.3e-3), and a table that left them out would say nothing of them.
# Beyond it a result is wrong, not imprecise. kdactl's own kernels get no such allowance.
PEER_TIMED_LIMIT = 2e-2


@dataclass(frozen=True)
class Check:
    """A candidate's output against the reference, before it is timed."""

    o_err: float
    state_err: float
    limit: float = ERROR_LIMIT
    detail: str = ""  # what the checked call did, where the call can say (small_bh: how its segments started)

    @property
    def ok(self) -> bool:
        return self.within(self.limit)

    def within(self, limit: float) -> bool:
        return self.o_err <= limit and self.state_err <= limit  # NaN/inf fail

    def to_json(self) -> dict:
        return {"ok": self.ok, "o_err": self.o_err, "state_err": self.state_err, "limit": self.limit}


@dataclass
class Candidate:
    """One thing to time on one shape. ``run`` makes one call on inputs the harness prepared;
    ``check`` runs it once against the reference. A candidate with a ``reason`` cannot run here."""

    name: str
    kind: str  # "auto" | "route" | "peer"
    run: Callable[[], Any] | None = None
    check: Callable[[], Check] | None = None
    reason: str | None = None
    reason_status: str = REJECTED  # REJECTED (ineligible) or UNAVAILABLE (not installed) when reason is set
    note: str = ""  # e.g. "auto -> direct"


@dataclass
class Outcome:
    name: str
    kind: str
    status: str
    reason: str | None = None
    note: str = ""
    check: Check | None = None
    summary: Summary | None = None
    blocks: list[list[float]] = field(default_factory=list)
    host: HostCost | None = None  # --host: CPU cost per call instead of device time

    @property
    def own(self) -> bool:
        return self.kind in OWN_KINDS

    @property
    def imprecise(self) -> bool:
        """A peer timed although its error ratio is over the SPEC's limit (PEER_TIMED_LIMIT)."""
        return self.status == OK and self.check is not None and not self.check.ok

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "status": self.status, "reason": self.reason,
                "note": self.note, "check": self.check.to_json() if self.check else None,
                "timing": self.summary.to_json() if self.summary else None,
                "blocks_ms": self.blocks, "host": self.host.to_json() if self.host else None}  # fmt: skip


@dataclass
class ShapeRun:
    shape: Shape
    outcomes: list[Outcome] = field(default_factory=list)
    error: str | None = None  # the shape could not be set up (inputs, reference)

    def outcome(self, name: str) -> Outcome | None:
        return next((o for o in self.outcomes if o.name == name), None)

    def median(self, name: str) -> float | None:
        o = self.outcome(name)
        return o.summary.median_ms if o is not None and o.status == OK and o.summary else None


class Harness(Protocol):
    """The GPU side of a run: device facts, candidates on prepared inputs, the L2 flush, the timer."""

    def info(self) -> dict[str, Any]: ...  # gpu, sku, versions, timer, flush_bytes, ...

    def candidates(self, shape: Shape, routes: Sequence[str] | None, peers: Sequence[str]) -> list[Candidate]: ...

    # routes None: auto and every route of this build

    def flush(self) -> None: ...  # evict L2; runs before the timed span

    def time_ms(self, fn: Callable[[], Any]) -> float: ...  # one call, in ms

    def host_cost(self, fn: Callable[[], Any]) -> HostCost: ...  # --host: CPU us per call, eager and replayed

    def host_context(self) -> dict[str, Any]: ...  # --host, after the runs: replay_floor_us, plans

    def release(self) -> None: ...  # drop the shape's tensors
