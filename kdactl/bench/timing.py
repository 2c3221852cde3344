"""Cold-L2 flush and the timers.

``KinetoTimer`` (the default, ``kineto``) and ``CuptiTimer`` (``cupti``, the optional cupti-python
extra) both sum the device durations of every kernel, memset and memcpy the call launched, read from
CUPTI's activity records: torch's own profiler (kineto) carries CUPTI inside torch, so the default
needs nothing beyond torch. Host gaps inside the call (Python overhead, a ``.tolist()`` sync) are not
counted, nor is the device's idle time between the call's kernels. ``kineto-span`` reads the same
records as the call's device span, from its first record's start to its last one's end: the gaps
between kernels count, and kernels that overlap (a programmatic dependent launch starts the next
kernel's CTAs during the last wave of the one before) count once. ``EventTimer`` (``cuda-events``)
measures the stream span between two events around the call, host launch overhead included. Timings
of different timers are different quantities: the report and every baseline name the timer, and the
gate compares only like with like. All flush L2 before the span, never inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kdactl.bench")

MIB = 1 << 20
FALLBACK_L2_BYTES = 128 * MIB  # when the driver reports no L2 size


def flush_bytes_for(l2_bytes: int | None) -> int:
    """At least twice the L2, rounded up to a MiB."""
    l2 = l2_bytes if l2_bytes and l2_bytes > 0 else FALLBACK_L2_BYTES
    return -(-2 * l2 // MIB) * MIB


class L2Flusher:
    """Zeroes a buffer of at least twice the L2 on the current stream, evicting what a previous
    iteration left in L2."""

    def __init__(self, device, l2_bytes: int | None):
        import torch

        self.nbytes = flush_bytes_for(l2_bytes)
        self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class EventTimer:
    name = "cuda-events"

    def __init__(self, device):
        self.device = device

    def time_ms(self, fn: Callable[[], Any]) -> float:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))


# kineto's activity types that are device work (its CPU-side and runtime records are not).
_DEVICE_ACTIVITIES = ("kernel", "gpu_memset", "gpu_memcpy")


class KinetoTimer:
    """Device time from torch.profiler: one profiling session around the call, then the summed
    durations of the device records it produced, or with ``span`` their span (device_span_ns).
    Sessions start outside the timed work, so their own cost is not counted."""

    def __init__(self, device, profiler=None, span: bool = False):
        import torch

        self.name = "kineto-span" if span else "kineto"
        self._measure = device_span_ns if span else device_ns
        self.device = device
        self._torch = torch
        self._profile = profiler or (lambda: torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]))

    def time_ms(self, fn: Callable[[], Any]) -> float:
        self._torch.cuda.synchronize(self.device)
        with self._profile() as prof:
            fn()
            self._torch.cuda.synchronize(self.device)
        ns = self._measure(prof.profiler.kineto_results.events())
        if ns <= 0:
            raise RuntimeError("torch.profiler recorded no device activity for the call (is CUPTI working?)")
        return ns / 1e6


def _device_work(events) -> list:
    """The device records among kineto events (kernels, memsets, memcpys)."""
    work = []
    for e in events:
        kind = e.activity_type() if hasattr(e, "activity_type") else None
        if kind is not None:
            device_work = kind in _DEVICE_ACTIVITIES
        else:  # an older torch: every CUDA-side record that is not a user annotation
            device_work = str(e.device_type()).endswith("CUDA") and not e.is_user_annotation()
        if device_work:
            work.append(e)
    return work


def device_ns(events) -> int:
    """Summed duration of the device records among kineto events."""
    return sum(int(e.duration_ns()) for e in _device_work(events))


def device_span_ns(events) -> int:
    """From the first device record's start to the last one's end (0 when there is none)."""
    work = _device_work(events)
    if not work:
        return 0
    return max(int(e.end_ns()) for e in work) - min(int(e.start_ns()) for e in work)


class CuptiTimer:
    """Kernel-level timing through CUPTI's activity API: the summed durations of the records the call
    produced (kernels, memsets, memcpys). Records from the flush are drained before the call."""

    name = "cupti"
    BUFFER_BYTES = 8 * MIB

    def __init__(self, device):
        from cupti import cupti  # optional extra: pip install cupti-python

        self.device = device
        self._cupti = cupti
        self._records: list[tuple[int, int]] = []
        self._kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMSET, cupti.ActivityKind.MEMCPY]
        cupti.activity_register_callbacks(self._requested, self._completed)
        for kind in self._kinds:
            cupti.activity_enable(kind)

    def _requested(self):
        return self.BUFFER_BYTES, 0

    def _completed(self, activities) -> None:
        for a in activities:
            self._records.append((int(a.start), int(a.end)))

    def _drain(self) -> list[tuple[int, int]]:
        import torch

        torch.cuda.synchronize(self.device)
        self._cupti.activity_flush_all(1)
        records, self._records = self._records, []
        return records

    def time_ms(self, fn: Callable[[], Any]) -> float:
        self._drain()  # the flush and anything before it
        fn()
        records = self._drain()
        if not records:
            raise RuntimeError("CUPTI recorded no kernel for the call (is the activity API working?)")
        return sum(end - start for start, end in records) / 1e6

    def close(self) -> None:
        for kind in self._kinds:
            try:
                self._cupti.activity_disable(kind)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass


TIMERS = ("kineto", "kineto-span", "cupti", "cuda-events")


def make_timer(device, prefer: str = "auto") -> tuple[Any, str]:
    """(timer, note). ``auto``: kineto, or CUDA events (with the reason) where its probe fails. A
    timer asked for by name is that timer or Inconclusive: a baseline of one timer is never judged
    with another."""
    from kdactl.errors import Inconclusive

    if prefer == "cuda-events":
        return EventTimer(device), "cuda-events requested"
    kinds = {"kineto": (KinetoTimer, "torch.profiler (kineto) device activity records"),
             "kineto-span": (lambda d: KinetoTimer(d, span=True), "torch.profiler (kineto) device span of the call"),
             "cupti": (CuptiTimer, "cupti-python activity records")}  # fmt: skip
    name = "kineto" if prefer == "auto" else prefer
    if name not in kinds:
        raise ValueError(f"unknown timer {prefer!r}; timers: auto, {', '.join(TIMERS)}")
    cls, note = kinds[name]
    timer = None
    try:
        timer = cls(device)
        _probe(timer, device)
    except Exception as err:  # noqa: BLE001 - a broken profiler must not stop the bench
        if timer is not None and hasattr(timer, "close"):
            timer.close()
        why = f"{name} unusable: {type(err).__name__}: {err}"
        if isinstance(err, ImportError) and name == "cupti":
            why = "cupti-python not installed (pip install 'kdactl[cupti]')"
        if prefer != "auto":
            raise Inconclusive(f"timer {name} requested but {why}") from None
        return EventTimer(device), why
    return timer, note


def _probe(timer, device) -> None:
    import torch

    x = torch.ones(1 << 20, device=device)
    ms = timer.time_ms(lambda: x.mul_(1.0))
    if not ms > 0:
        raise RuntimeError(f"probe kernel timed at {ms} ms")
    log.info("%s probe: 4 MiB multiply took %.4f ms", timer.name, ms)
