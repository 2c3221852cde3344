"""The node, read once: frozen facts that every later decision (target, checks, certificate) uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdactl.errors import NoGpu
from kdactl.hw.driver import Version, version_str
from kdactl.hw.toolkit import Toolkit


@dataclass(frozen=True)
class GpuFacts:
    index: int  # NVML index (PCI bus order)
    uuid: str
    name: str
    sku: str  # kdactl.node.classify_sku, or "unknown"
    cc: Version
    sm_count: int | None  # None when torch.cuda cannot see this GPU
    memory_mib: int
    l2_bytes: int | None
    mig: str | None
    ecc: str | None
    target: str | None  # the kernel target for this GPU; None when there is none
    target_reason: str  # how the target was chosen, or why there is none
    health: Any = None  # kdactl.hw.health.HealthFacts; None where NVML was not read

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "sku": self.sku,
            "cc": version_str(self.cc),
            "sm_count": self.sm_count,
            "memory_mib": self.memory_mib,
            "l2_bytes": self.l2_bytes,
            "mig": self.mig,
            "ecc": self.ecc,
            "target": self.target,
            "target_reason": self.target_reason,
            "health": self.health.to_json() if self.health is not None else None,
        }


@dataclass(frozen=True)
class NodeFacts:
    host_arch: str  # platform.machine(): "x86_64", "aarch64"
    driver_version: str | None
    cuda_driver: Version | None  # the newest CUDA the driver supports
    driver_source: str | None  # "nvml" or "nvidia-smi"
    toolkit: Toolkit | None  # nvcc; None when there is none (see warnings)
    torch_version: str | None
    torch_cuda: str | None
    cuda_arch_override: str | None  # KDACTL_CUDA_ARCH
    gpus: tuple[GpuFacts, ...]
    warnings: tuple[str, ...]
    error: str | None = None  # why the GPUs could not be read (no driver, no GPU); gpus is then empty

    @property
    def target(self) -> str | None:
        """The node's one kernel target, when every GPU has the same one; else None."""
        targets = {g.target for g in self.gpus}
        return targets.pop() if len(targets) == 1 else None

    def require_gpus(self) -> tuple[GpuFacts, ...]:
        """The GPUs, or NoGpu with the reason (for callers that need a GPU)."""
        if self.error or not self.gpus:
            raise NoGpu(self.error or "no NVIDIA GPU found")
        return self.gpus

    def to_json(self) -> dict[str, Any]:
        tk = self.toolkit
        return {
            "node": {
                "host_arch": self.host_arch,
                "driver_version": self.driver_version,
                "cuda_driver_version": version_str(self.cuda_driver),
                "driver_source": self.driver_source,
                "cuda_toolkit": None
                if tk is None
                else {"version": tk.version_str, "nvcc": tk.nvcc, "build": tk.banner},
                "torch": {"version": self.torch_version, "cuda": self.torch_cuda},
                "cuda_arch_override": self.cuda_arch_override,
                "target": self.target,
            },
            "gpus": [g.to_json() for g in self.gpus],
            "warnings": list(self.warnings),
            "error": self.error,
        }
