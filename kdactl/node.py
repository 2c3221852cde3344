"""Node detection: read the node once (gather_node), then decide SKU, kernel target and warnings in
pure functions. ``kdactl detect`` renders the result (detect_node); ``kdactl build`` and ``certify``
use gather_node to learn the node's GPUs and target.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from kdactl.errors import Inconclusive, KdactlError
from kdactl.hw.cuda_torch import TorchDevice, TorchInfo, normalize_uuid
from kdactl.hw.detect_report import DetectReport
from kdactl.hw.driver import DriverGpu, DriverInfo, Version, version_str
from kdactl.hw.facts import GpuFacts, NodeFacts
from kdactl.hw.nvml import NvmlUnavailable
from kdactl.hw.providers import Providers, real_providers
from kdactl.hw.toolkit import Toolkit
from kdactl.jit.resolver import TargetResolver
from kdactl.settings import Settings
from kdactl.skus import SkuSpec, classify_sku  # classify_sku: a SPEC name of this module
from kdactl.targets import target_runs_on

__all__ = ["classify_sku", "gather_node", "detect_node", "NodeFacts", "GpuFacts", "Providers"]

# ---------------------------------------------------------------------------------------------
# Gather once


def gather_node(settings: Settings, providers: Providers | None = None) -> NodeFacts:
    """Read the node once. No driver or no GPU is not raised: it is ``NodeFacts.error`` with empty
    ``gpus`` (``require_gpus()`` raises NoGpu). An unknown KDACTL_CUDA_ARCH raises UsageError."""
    p = providers or real_providers(settings)
    resolver = TargetResolver.from_settings(settings)
    resolver.override_target()  # a typo in KDACTL_CUDA_ARCH is a configuration error, before anything runs
    override = settings.cuda_arch
    skus = p.skus()
    toolkit, toolkit_problem = _read_toolkit(p)
    torch = p.torch.read()
    driver, error = _read_driver(p)
    gpus = tuple(_gpu_facts(g, driver, torch, toolkit, resolver) for g in driver.gpus) if driver else ()
    if driver is not None and not gpus:
        error = f"no NVIDIA GPU: the driver ({driver.driver_version}) reports 0 GPUs"
    return NodeFacts(
        host_arch=p.machine(),
        driver_version=driver.driver_version if driver else None,
        cuda_driver=driver.cuda_driver if driver else None,
        driver_source=driver.source if driver else None,
        toolkit=toolkit,
        torch_version=torch.version,
        torch_cuda=torch.cuda,
        cuda_arch_override=override,
        gpus=gpus,
        warnings=node_warnings(gpus, driver, toolkit, toolkit_problem, torch, override, skus),
        error=error,
    )


def detect_node(settings: Settings, providers: Providers | None = None) -> DetectReport:
    """``kdactl detect``: the facts as a Report; exit 3 without GPUs or without a kernel target."""
    return DetectReport(gather_node(settings, providers))


def _read_toolkit(p: Providers) -> tuple[Toolkit | None, str | None]:
    try:
        return p.toolkit(), None
    except KdactlError as err:
        return None, str(err)


def _read_driver(p: Providers) -> tuple[DriverInfo | None, str | None]:
    """NVML first; nvidia-smi only when NVML cannot be loaded. Errors become the reason string."""
    try:
        return p.driver.read(), None
    except NvmlUnavailable as err:
        if p.fallback is None:
            return None, str(err)
        try:
            return p.fallback.read(), None
        except Inconclusive as err2:
            return None, f"{err}; nvidia-smi fallback: {err2}"
    except Inconclusive as err:
        return None, str(err)


def _gpu_facts(g: DriverGpu, driver: DriverInfo, torch: TorchInfo, toolkit: Toolkit | None,
               resolver: TargetResolver) -> GpuFacts:  # fmt: skip
    dev = match_torch_device(g, torch, len(driver.gpus))
    sm = dev.sm_count if dev else None
    target, reason = resolver.decide(g.cc, toolkit=toolkit.version if toolkit else None, driver_cuda=driver.cuda_driver)
    return GpuFacts(
        index=g.index,
        uuid=g.uuid,
        name=g.name,
        sku=classify_sku(g.name, g.cc, sm or 0),
        cc=g.cc,
        sm_count=sm,
        memory_mib=g.memory_mib,
        l2_bytes=dev.l2_bytes if dev else None,
        mig=g.mig,
        ecc=g.ecc,
        target=target,
        target_reason=reason,
        health=g.health,
    )


# ---------------------------------------------------------------------------------------------
# Decide (pure)


def match_torch_device(g: DriverGpu, torch: TorchInfo, n_driver_gpus: int) -> TorchDevice | None:
    """torch's device for an NVML GPU: by UUID (torch's order follows CUDA_VISIBLE_DEVICES and
    CUDA_DEVICE_ORDER, not NVML's), by index only when torch has no UUIDs and sees every GPU."""
    if any(d.uuid for d in torch.devices):
        want = normalize_uuid(g.uuid)
        return next((d for d in torch.devices if d.uuid == want), None)
    if len(torch.devices) == n_driver_gpus:
        return torch.devices[g.index] if g.index < len(torch.devices) else None
    return None


def node_warnings(
    gpus: tuple[GpuFacts, ...],
    driver: DriverInfo | None,
    toolkit: Toolkit | None,
    toolkit_problem: str | None,
    torch: TorchInfo,
    override: str | None,
    skus: Mapping[str, SkuSpec],
) -> tuple[str, ...]:
    """Everything worth a look that does not by itself make the node inconclusive."""
    out: list[str] = []
    if toolkit_problem:
        out.append(toolkit_problem)
    cuda_driver = driver.cuda_driver if driver else None
    if toolkit and cuda_driver and cuda_driver < toolkit.version:
        out.append(
            f"the driver supports CUDA {version_str(cuda_driver)}, older than the CUDA toolkit {toolkit.version_str} (nvcc): "
            "kernels nvcc builds may not load; update the driver or use an older toolkit"
        )
    torch_cuda = _parse_version(torch.cuda)
    if torch_cuda and cuda_driver and cuda_driver < torch_cuda:
        out.append(
            f"torch {torch.version} is built for CUDA {torch.cuda}, newer than the driver's CUDA {version_str(cuda_driver)}"
        )
    if gpus and torch.problem and len(torch.devices) < len(gpus):
        out.append(f"{torch.problem}: SM count and L2 unknown for GPUs torch cannot see")
    models = Counter(g.name for g in gpus)
    if len(models) > 1:
        out.append("mixed GPU models on this node: " + ", ".join(_model_group(name, gpus) for name in models))
    for g in gpus:
        out.extend(gpu_warnings(g, skus, override))
    return tuple(out)


def gpu_warnings(g: GpuFacts, skus: Mapping[str, SkuSpec], override: str | None) -> list[str]:
    out = []
    where = f"GPU {g.index} ({g.name})"
    if g.sm_count is None:
        out.append(f"{where}: torch.cuda cannot see it; SM count and L2 unknown")
    spec = skus.get(g.sku)
    if spec is None:
        sms = "unknown" if g.sm_count is None else g.sm_count
        out.append(
            f"{where}: SKU {g.sku!r} (cc {version_str(g.cc)}, {sms} SMs) is not in fleet/skus.toml: "
            "no expected SM count, routes or baselines"
        )
    elif g.sm_count is not None and g.sm_count != spec.sm_count:
        mig = " (MIG is enabled)" if g.mig == "enabled" else ""
        out.append(f"{where}: actual {g.sm_count} SMs, expected {spec.sm_count} for {g.sku} (fleet/skus.toml){mig}")
    if override and g.target and not target_runs_on(g.target, g.cc):
        out.append(f"{where}: KDACTL_CUDA_ARCH={override} does not run on compute capability {version_str(g.cc)}")
    return out


def _model_group(name: str, gpus: tuple[GpuFacts, ...]) -> str:
    idx = [g.index for g in gpus if g.name == name]
    return f"{len(idx)}x {name} (GPU {','.join(map(str, idx))})"


def _parse_version(text: str | None) -> Version | None:
    m = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None
