"""The real Harness: one CUDA device through torch, the L2 flusher, the timer, and the candidates.

Creating it is where the bench meets the node: no CUDA GPU, or a kernel library that cannot be
built or loaded, ends here as Inconclusive (exit 3) with the reason.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

from kdactl.bench.model import Candidate
from kdactl.bench.suites import Shape
from kdactl.errors import Inconclusive, NoGpu

log = logging.getLogger("kdactl.bench")


def _torch():
    try:
        import torch
    except Exception as err:  # noqa: BLE001
        raise NoGpu(f"no CUDA GPU: torch does not import ({type(err).__name__}: {err})") from None
    return torch


class TorchHarness:
    def __init__(self, device_index: int = 0, timer: str = "auto"):
        torch = _torch()
        if not torch.cuda.is_available():
            raise NoGpu(f"no CUDA GPU: torch {torch.__version__} sees no CUDA device")
        if not 0 <= device_index < torch.cuda.device_count():
            raise Inconclusive(f"no CUDA GPU at index {device_index} (torch sees {torch.cuda.device_count()})")
        from kdactl.bench.timing import L2Flusher, make_timer

        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        torch.set_grad_enabled(False)  # inference, as when serving (fla picks its backend on this)
        self.props = torch.cuda.get_device_properties(self.device)
        self._check_library()
        self.flusher = L2Flusher(self.device, getattr(self.props, "L2_cache_size", None))
        self.timer, self.timer_note = make_timer(self.device, timer)
        self._inputs: dict[str, Any] | None = None
        self._ref: Any = None  # the fp64 reference of the current shape's inputs
        self._graphs: list[Any] = []  # --host: captured graphs, kept alive while their shape runs
        log.info("bench on %s (cc %d.%d, %d SMs), timer %s (%s), L2 flush %d MiB", self.props.name,
                 self.props.major, self.props.minor, self.props.multi_processor_count, self.timer.name,
                 self.timer_note, self.flusher.nbytes >> 20)  # fmt: skip

    def _check_library(self) -> None:
        from kdactl.kda.device import device_info

        try:
            device_info(self.device.index)  # builds or loads the kernel library once
        except Inconclusive:
            raise
        except Exception as err:  # noqa: BLE001
            raise Inconclusive(f"kernel library unavailable: {type(err).__name__}: {err}") from None

    def sku(self) -> str:
        """The SKU certify classified (KDACTL_SKU, set for its workers), else this GPU's own."""
        from kdactl.node import classify_sku

        p = self.props
        return os.environ.get("KDACTL_SKU") or classify_sku(p.name, (p.major, p.minor), p.multi_processor_count)

    def info(self) -> dict[str, Any]:
        import torch

        p = self.props
        return {
            "gpu": p.name, "device_index": self.device.index, "cc": f"{p.major}.{p.minor}",
            "sm_count": p.multi_processor_count, "sku": self.sku(), "l2_bytes": getattr(p, "L2_cache_size", None),
            "timer": self.timer.name, "timer_note": self.timer_note, "flush_bytes": self.flusher.nbytes,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "fla": _fla_version(),
            "fla_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLA_")},
            "kernel_target": _target(self.device.index), "host": platform.node(),
            "grad_mode": "torch.set_grad_enabled(False): inference, as when serving",
        }  # fmt: skip

    def candidates(self, shape: Shape, routes: Sequence[str] | None, peers: Sequence[str]) -> list[Candidate]:
        from kdactl.bench.candidates import make_inputs, own_candidates, reference
        from kdactl.bench.peers import peer_candidates

        self.release()
        self._inputs = make_inputs(shape, self.device)
        log.info("%s: computing the fp32 reference", shape.key)
        self._ref = ref = reference(self._inputs)
        return own_candidates(self._inputs, ref, routes, self.device) + peer_candidates(self._inputs, ref, peers)

    def flush(self) -> None:
        self.flusher()

    def time_ms(self, fn: Callable[[], Any]) -> float:
        return self.timer.time_ms(fn)

    def host_cost(self, fn: Callable[[], Any]):
        import time

        import torch

        from kdactl.bench.host import host_cost

        return host_cost(fn, lambda: torch.cuda.synchronize(self.device), time.perf_counter, self._capture)

    def host_context(self) -> dict[str, Any]:
        """What bounds the --host figures on this node: the replay of a CUDA graph of one tiny kernel
        (no candidate's replay can cost less through torch), and which table kept kdactl's plans."""
        import time

        import torch

        from kdactl.bench.host import per_call_us
        from kdactl.kda import plans

        tiny = torch.zeros(1, device=self.device)
        replay = self._capture(lambda: tiny.add_(1))
        floor = per_call_us(replay, lambda: torch.cuda.synchronize(self.device), time.perf_counter)
        return {"replay_floor_us": round(floor, 3), "plans": plans.host_status()}

    def _capture(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` captured in a CUDA graph, after the eager calls host_cost made on this stream (a
        workspace is bound to the stream that first used it: no side-stream warmup); the graph
        lives until the shape is released."""
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        self._graphs.append(graph)
        return graph.replay

    def release(self) -> None:
        import torch

        self._graphs = []
        self._inputs, self._ref = None, None
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


def _fla_version() -> str | None:
    try:
        from kdactl.bench.peers import load_fla

        return load_fla()[1]
    except Exception:  # noqa: BLE001 - reported as absent
        return None


def _target(index: int) -> str | None:
    try:
        from kdactl.kda.device import device_info

        return device_info(index).target
    except Exception:  # noqa: BLE001
        return None
