"""What else is happening on a GPU while it is timed: other compute processes and clock-event
(throttle) reasons, sampled through NVML, judged by a pure function.

A GPU shared with another process times slow for a reason that says nothing about the node, so the
perf gate is then inconclusive, never failed. Throttling (power cap, thermal, hardware slowdown)
is recorded as a warning with its reasons.

Which process is ours: NVML lists processes by the host's PIDs. Inside a container those do not
match ``os.getpid()``; a sample taken while this process holds a CUDA context that does not list
our PID therefore counts one unknown process as ours. The sample taken before the bench touches
CUDA has no such allowance.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# nvmlClocksEventReason* bits (pynvml; formerly ClocksThrottleReason*) that slow a timed run.
THROTTLE_REASONS = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
SAMPLE_PERIOD_S = 0.25


@dataclass(frozen=True)
class Sample:
    pids: tuple[int, ...]  # compute and graphics processes on the GPU
    reasons: int | None  # clock-event reason bits; None where NVML cannot say
    ours_running: bool  # this process held a CUDA context when it was taken


@dataclass(frozen=True)
class Activity:
    busy: str | None  # why the timing is not the node's alone, or None
    throttle: str | None  # the throttle reasons seen, or None


def judge_activity(samples: Iterable[Sample], own_pids: Iterable[int]) -> Activity:
    samples = list(samples)
    own = set(own_pids)
    most, seen = 0, set()
    for s in samples:
        others = [p for p in s.pids if p not in own]
        if s.ours_running and own.isdisjoint(s.pids) and others:
            others = others[1:]  # our own context under another PID namespace
        most = max(most, len(others))
        seen.update(others)
    busy = None
    if most:
        listed = ", ".join(str(p) for p in sorted(seen)[:8])
        busy = f"GPU busy: {most} other process{'es' if most > 1 else ''} on the GPU while it was timed (pids {listed})"
    bits = 0
    for s in samples:
        bits |= s.reasons or 0
    names = [name for bit, name in THROTTLE_REASONS.items() if bits & bit]
    throttle = f"clocks throttled while timed: {', '.join(names)}" if names else None
    return Activity(busy, throttle)


class NvmlActivity:
    """Samples one GPU (by NVML index) through pynvml; ``lib`` may be a fake with the same names."""

    def __init__(self, index: int, lib: Any = None) -> None:
        from kdactl.hw.nvml import _Caller, _load_pynvml

        self._call = _Caller(lib if lib is not None else _load_pynvml())
        self._call.init()
        self._handle = self._call("nvmlDeviceGetHandleByIndex", index, gpu=index)
        self.index = index

    def sample(self, ours_running: bool) -> Sample:
        pids: list[int] = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in self._call(fn, self._handle, gpu=self.index, optional=True) or ():
                pids.append(int(p.pid))
        reasons = self._call("nvmlDeviceGetCurrentClocksEventReasons", self._handle, gpu=self.index, optional=True)
        if reasons is None:
            reasons = self._call(
                "nvmlDeviceGetCurrentClocksThrottleReasons", self._handle, gpu=self.index, optional=True
            )
        return Sample(tuple(sorted(set(pids))), None if reasons is None else int(reasons), ours_running)

    def close(self) -> None:
        self._call.shutdown()


class Monitor:
    """Samples before the work (``start``), every SAMPLE_PERIOD_S during it, and once after (``stop``)."""

    def __init__(self, sampler: Callable[[bool], Sample], period_s: float = SAMPLE_PERIOD_S) -> None:
        self._sample = sampler
        self._period = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[Sample] = []
        self.errors: list[str] = []

    def _take(self, ours_running: bool) -> None:
        try:
            self.samples.append(self._sample(ours_running))
        except Exception as err:  # noqa: BLE001 - an unreadable sample is reported, not fatal
            self.errors.append(f"{type(err).__name__}: {err}")

    def start(self) -> None:
        self._take(False)
        self._thread = threading.Thread(target=self._loop, name="kdactl-activity", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self._take(True)

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take(True)
        return self.samples


def watched(index: int, work: Callable[[], Any], lib: Any = None) -> tuple[Any, list[Sample], list[str]]:
    """work()'s value with the samples of GPU ``index`` taken around and during it, and why any
    sample could not be taken (NVML missing or failing is reported, never fatal)."""
    try:
        nvml = NvmlActivity(index, lib)
    except Exception as err:  # noqa: BLE001
        return work(), [], [f"NVML: {type(err).__name__}: {err}"]
    monitor = Monitor(nvml.sample)
    monitor.start()
    try:
        value = work()
    finally:
        samples = monitor.stop()
        nvml.close()
    return value, samples, monitor.errors


def own_pids() -> tuple[int, ...]:
    """This worker and the certify process that started it."""
    return os.getpid(), os.getppid()
