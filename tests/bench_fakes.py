"""A fake bench Harness: candidates with set times and check results, and a log of every flush and
timed call, so the runner's ordering, statistics and verdicts are tested without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from kdactl.bench.model import UNAVAILABLE, Candidate, Check
from kdactl.kda.routes import ROUTES

OWN = {"auto": "auto", **{route: "route" for route in ROUTES}}


@dataclass
class FakeHarness:
    times: dict[str, float] = field(default_factory=lambda: {"auto": 1.0, "direct": 1.0, "fla.chunk_kda": 2.0})
    wrong: set[str] = field(default_factory=set)  # candidates whose check fails
    errors: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (o, state) error ratios
    details: dict[str, str] = field(default_factory=dict)  # name -> what its checked call says it did
    raising: dict[str, str] = field(default_factory=dict)  # name -> "check" | "warmup" | "time"
    rejected: dict[str, str] = field(default_factory=dict)  # route -> reason
    unavailable: set[str] = field(default_factory=set)
    jitter: Callable[[str, int], float] = lambda name, i: 0.0  # added to the i-th timed call of name
    setup_error: str | None = None
    sku: str = "H200"
    host_us: dict[str, float] = field(default_factory=dict)  # --host: CPU us per call (default 10)
    not_capturable: set[str] = field(default_factory=set)
    events: list[str] = field(default_factory=list)  # "flush", "time:<name>", "call:<name>"
    shapes: list = field(default_factory=list)  # every shape candidates() was asked for
    released: int = 0
    _counts: dict[str, int] = field(default_factory=dict)
    _timing: bool = False

    def info(self) -> dict[str, Any]:
        return {"gpu": "Fake H200", "sku": self.sku, "cc": "9.0", "timer": "fake", "timer_note": "fake clock",
                "flush_bytes": 2 << 20, "torch": "0", "fla": "0", "kernel_target": "sm_90a"}  # fmt: skip

    def candidates(self, shape, routes, peers) -> list[Candidate]:
        if self.setup_error:
            raise RuntimeError(self.setup_error)
        self.shapes.append(shape)
        names = list(routes or ("auto", "direct"))
        names += [n for p in peers for n in self.times if n.startswith(p + ".")]
        return [self._candidate(n) for n in names]

    def _candidate(self, name: str) -> Candidate:
        kind = OWN.get(name, "peer")
        if name in self.rejected:
            return Candidate(name, kind, reason=self.rejected[name])
        if name in self.unavailable:
            return Candidate(name, kind, reason="not installed", reason_status=UNAVAILABLE)
        return Candidate(name, kind, run=lambda: self._call(name), check=lambda: self._check(name),
                         note="auto -> direct" if name == "auto" else "")  # fmt: skip

    def _check(self, name: str) -> Check:
        if self.raising.get(name) == "check":
            raise RuntimeError(f"{name} crashed")
        self.events.append(f"call:{name}")  # a real check runs the candidate once
        if name in self.errors:
            return Check(*self.errors[name])
        return Check(0.5, 0.5) if name in self.wrong else Check(1e-4, 2e-4, detail=self.details.get(name, ""))

    def _call(self, name: str):
        self.events.append(f"call:{name}")
        if self.raising.get(name) == "warmup" and not self._timing:
            raise RuntimeError(f"{name} warmup crashed")
        if self.raising.get(name) == "time" and self._timing:
            raise RuntimeError(f"{name} launch failed")

    def flush(self) -> None:
        self.events.append("flush")

    def time_ms(self, fn) -> float:
        self._timing = True
        try:
            before = len(self.events)
            fn()
            name = self.events[before].split(":", 1)[1]
        finally:
            self._timing = False
        i = self._counts.get(name, 0)
        self._counts[name] = i + 1
        self.events.append(f"time:{name}")
        return self.times[name] + self.jitter(name, i)

    def host_context(self):
        return {"replay_floor_us": 1.0, "plans": "kdactl_host (cache)"}

    def host_cost(self, fn):
        """--host: the real host_cost over a fake clock that advances host_us[name] per call."""
        from kdactl.bench.host import host_cost

        clock = [0.0]
        before = len(self.events)
        fn()
        name = self.events[before].split(":", 1)[1]
        cost = self.host_us.get(name, 10.0) * 1e-6

        def call():
            fn()
            clock[0] += cost

        def capture(f):
            if name in self.not_capturable:
                raise RuntimeError(f"{name}: operation not permitted when stream is capturing")
            return lambda: clock.__setitem__(0, clock[0] + cost / 10)

        return host_cost(call, lambda: None, lambda: clock[0], capture, calls=20, repeats=3)

    def release(self) -> None:
        self.released += 1

    def timed_order(self) -> list[str]:
        return [e.split(":", 1)[1] for e in self.events if e.startswith("time:")]

