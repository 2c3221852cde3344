"""``kdactl bench --host``: what one KDA call costs the CPU that issues it.

A serving engine issues prefill calls from Python between other work; the GPU time of a small call
(B1 T64 H4: a few microseconds) is then smaller than the host's cost of issuing it, which is what
limits the engine. Two figures per candidate, each the median over repeats of the CPU time of
``calls`` calls issued back to back, divided by ``calls`` (the device is synchronized before each
repeat and after, outside the span):

  eager   the call as an engine makes it (validation, route decision, launch);
  replay  the same call captured once in a CUDA graph and replayed (``None`` with the reason when the
          candidate cannot be captured: a call that reads device values back, for one).

Pure timing logic over injected callables, so the CPU tests drive it with a fake clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CALLS = 200  # per repeat: far below the launch queue's depth, so the host never waits on the GPU
REPEATS = 7


@dataclass(frozen=True)
class HostCost:
    eager_us: float
    replay_us: float | None
    replay_note: str = ""  # why there is no replay figure
    calls: int = CALLS
    repeats: int = REPEATS

    def to_json(self) -> dict[str, Any]:
        return {"eager_us": self.eager_us, "replay_us": self.replay_us, "replay_note": self.replay_note,
                "calls": self.calls, "repeats": self.repeats}  # fmt: skip


def per_call_us(fn: Callable[[], Any], sync: Callable[[], None], clock: Callable[[], float],
                calls: int = CALLS, repeats: int = REPEATS) -> float:  # fmt: skip
    """Median over ``repeats`` of the CPU microseconds per call of ``calls`` back-to-back calls."""
    if calls < 1 or repeats < 1:
        raise ValueError(f"calls and repeats must be positive, got {calls} and {repeats}")
    per = []
    for _ in range(repeats):
        sync()
        start = clock()
        for _ in range(calls):
            fn()
        per.append((clock() - start) / calls * 1e6)
        sync()
    return statistics.median(per)


def host_cost(fn: Callable[[], Any], sync: Callable[[], None], clock: Callable[[], float],
              capture: Callable[[Callable[[], Any]], Callable[[], Any]], calls: int = CALLS,
              repeats: int = REPEATS) -> HostCost:  # fmt: skip
    """Eager and graph-replay cost of ``fn``; ``capture(fn)`` returns the replay callable, or
    raises when ``fn`` cannot be captured (that is a note, not an error of the run)."""
    eager = per_call_us(fn, sync, clock, calls, repeats)
    try:
        replay = capture(fn)
    except Exception as err:  # noqa: BLE001 - the candidate's limit, reported with the figure
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return HostCost(eager, None, f"not capturable: {type(err).__name__}: {first}", calls, repeats)
    return HostCost(eager, per_call_us(replay, sync, clock, calls, repeats), "", calls, repeats)
