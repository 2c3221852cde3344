"""torch.cuda's view of the GPUs: SM count and L2 size (NVML knows neither), and torch's versions.

torch is imported only when a reading is taken. A torch that cannot see the GPUs (a CPU build,
CUDA_VISIBLE_DEVICES) is not an error here: the reading says why, and node.py warns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TorchDevice:
    index: int  # torch's ordinal (after CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER)
    uuid: str | None  # "fa9f48df-..." (no "GPU-" prefix); None on a torch without it
    name: str
    sm_count: int
    l2_bytes: int


@dataclass(frozen=True)
class TorchInfo:
    version: str | None  # "2.11.0+cu130"; None when torch cannot be imported
    cuda: str | None  # torch.version.cuda, "13.0"; None for a CPU build
    devices: tuple[TorchDevice, ...]
    problem: str | None = None  # why devices is empty or short, in one line


class TorchCudaProvider(Protocol):
    def read(self) -> TorchInfo: ...


class TorchCuda:
    """TorchCudaProvider over the real torch. ``torch`` may be a stand-in module for tests."""

    def __init__(self, torch: Any = None) -> None:
        self._torch = torch

    def read(self) -> TorchInfo:
        torch = self._torch
        if torch is None:
            try:
                import torch
            except Exception as err:  # noqa: BLE001 - a broken torch install is a fact to report
                return TorchInfo(None, None, (), f"cannot import torch: {type(err).__name__}: {err}")
        version, cuda = str(torch.__version__), getattr(torch.version, "cuda", None)
        if cuda is None:
            return TorchInfo(version, None, (), f"torch {version} is a CPU-only build")
        try:
            count = torch.cuda.device_count()
            devices = tuple(_device(torch, i) for i in range(count))
        except Exception as err:  # noqa: BLE001 - CUDA init errors arrive as RuntimeError and others
            return TorchInfo(version, cuda, (), f"torch.cuda failed: {type(err).__name__}: {err}")
        problem = None if devices else "torch.cuda sees no GPU (check CUDA_VISIBLE_DEVICES)"
        return TorchInfo(version, cuda, devices, problem)


def _device(torch: Any, index: int) -> TorchDevice:
    p = torch.cuda.get_device_properties(index)
    uuid = getattr(p, "uuid", None)
    return TorchDevice(
        index=index,
        uuid=normalize_uuid(str(uuid)) if uuid is not None else None,
        name=str(p.name),
        sm_count=int(p.multi_processor_count),
        l2_bytes=int(getattr(p, "L2_cache_size", 0)),
    )


def normalize_uuid(uuid: str) -> str:
    """NVML says 'GPU-fa9f...', torch says 'fa9f...': compare without the prefix, lower case."""
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u
