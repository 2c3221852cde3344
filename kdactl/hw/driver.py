"""What the NVIDIA driver says about the node: the shape both NVML and the nvidia-smi fallback return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Version = tuple[int, int]


@dataclass(frozen=True)
class DriverGpu:
    """One GPU as the driver reports it (NVML index order, i.e. PCI bus order)."""

    index: int
    uuid: str  # "GPU-fa9f48df-..."
    name: str  # "NVIDIA H200"
    memory_mib: int  # total framebuffer, MiB
    cc: Version  # compute capability
    mig: str | None  # "enabled" / "disabled"; None where the GPU has no MIG
    ecc: str | None  # "enabled" / "disabled"; None where the GPU has no ECC
    health: Any = None  # kdactl.hw.health.HealthFacts (NVML only; None from nvidia-smi)


@dataclass(frozen=True)
class DriverInfo:
    source: str  # "nvml" or "nvidia-smi"
    driver_version: str  # "580.159.04"
    cuda_driver: Version | None  # highest CUDA version the driver supports, (13, 0)
    gpus: tuple[DriverGpu, ...]


class DriverProvider(Protocol):
    """Reads the driver once. Raises kdactl.errors.NoGpu when there is no driver to ask, and
    kdactl.errors.Inconclusive when the driver answered with an error."""

    def read(self) -> DriverInfo: ...


def on_off(value: int | None) -> str | None:
    """NVML's 0/1 mode flags as words."""
    if value is None:
        return None
    return "enabled" if value else "disabled"


def version_str(v: Version | None) -> str | None:
    return None if v is None else f"{v[0]}.{v[1]}"
