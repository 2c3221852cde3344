"""Cold-L2 flush and the two timers: CUPTI kernel durations (cupti-python) or CUDA events.

``CuptiTimer`` sums the device durations of every kernel, memset and memcpy the call launched,
so host gaps inside the call (Python overhead, a ``.tolist()`` sync) are not counted. ``EventTimer``
measures the stream span between two events around the call, host gaps included. The report names
the timer used. Both flush L2 before the span, never inside it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

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


def make_timer(device, prefer: str = "auto") -> tuple[Any, str]:
    """(timer, note). CUPTI when cupti-python imports and a probe call produces records (unless
    prefer == "cuda-events"); else CUDA events, with the reason CUPTI was not used."""
    if prefer == "cuda-events":
        return EventTimer(device), "cuda-events requested"
    try:
        timer = CuptiTimer(device)
    except ImportError:
        return EventTimer(device), "cupti-python not installed (pip install 'kdactl[cupti]')"
    except Exception as err:  # noqa: BLE001 - a broken CUPTI must not stop the bench
        return EventTimer(device), f"CUPTI unusable: {type(err).__name__}: {err}"
    try:
        _probe(timer, device)
    except Exception as err:  # noqa: BLE001
        timer.close()
        return EventTimer(device), f"CUPTI probe failed: {type(err).__name__}: {err}"
    return timer, "cupti-python activity records"


def _probe(timer: CuptiTimer, device) -> None:
    import torch

    x = torch.ones(1 << 20, device=device)
    ms = timer.time_ms(lambda: x.mul_(1.0))
    if not ms > 0:
        raise RuntimeError(f"probe kernel timed at {ms} ms")
    log.info("CUPTI probe: 4 MiB multiply took %.4f ms", ms)
