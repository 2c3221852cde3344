"""The one target resolver: which kernel target this node loads, and why.

It owns the inputs of the target policy (kdactl.targets.decide_target): KDACTL_CUDA_ARCH, the
prebuilt (AOT) bundle's entry for a device, the nvcc's CUDA version, the driver's CUDA version. Every
caller (detection, the loader, ``kdactl build``, the gate, the JIT checks) asks it, so that all of
them name the same target for the same node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kdactl.errors import Inconclusive, KdactlError, UnsupportedTarget
from kdactl.hw.facts import GpuFacts
from kdactl.settings import Settings
from kdactl.targets import Version, decide_target, get_target, select_target, target_runs_on


@dataclass(frozen=True)
class TargetResolver:
    override: str | None = None  # KDACTL_CUDA_ARCH
    aot_dir: Path | None = None  # KDACTL_AOT_DIR

    @classmethod
    def from_settings(cls, settings: Settings) -> TargetResolver:
        return cls(settings.cuda_arch, settings.aot_dir)

    def override_target(self) -> str | None:
        """The KDACTL_CUDA_ARCH target; UsageError for a name that is no target."""
        return get_target(self.override).name if self.override else None

    def bundle_target(self, cc: Version) -> str | None:
        """The AOT bundle's target for a device (what the loader would load), None without a usable one."""
        if not self.aot_dir:
            return None
        from kdactl.jit.aot import read_index

        try:
            return bundle_target_for(read_index(self.aot_dir), cc)
        except (KdactlError, OSError):
            return None  # the loader reports a broken bundle when it opens it

    def decide(self, cc: Version, *, toolkit: Version | None = None,
               driver_cuda: Version | None = None) -> tuple[str | None, str]:  # fmt: skip
        """(target, how it was chosen) or (None, why there is none) for a device of compute capability cc."""
        aot = None if self.override else self.bundle_target(cc)
        return decide_target(cc, override=self.override, aot=aot, toolkit=toolkit, driver_cuda=driver_cuda)

    def require(self, cc: Callable[[], Version], toolkit: Callable[[], Version]) -> str:
        """The target for the current device; UnsupportedTarget when there is none. ``cc`` is read only
        without KDACTL_CUDA_ARCH, ``toolkit`` (nvcc's CUDA) only when the bundle has no entry either."""
        named = self.override_target()
        if named:
            return named
        device = cc()
        found = self.bundle_target(device)
        target, why = decide_target(device, aot=found, toolkit=None if found else toolkit())
        if target is None:
            raise UnsupportedTarget(why)
        return target

    def node_target(self, gpus: Callable[[], tuple[GpuFacts, ...]]) -> str:
        """KDACTL_CUDA_ARCH, else the one target every GPU of the node needs (``gpus``: the node's
        GPUs, each with the target this resolver chose for it; read only without the override)."""
        return self.override_target() or one_target(gpus())

    def targets_for(self, ccs: Iterable[Version], toolkit: Version | None, fallback: Iterable[str]) -> set[str]:
        """The targets the node loads now; ``fallback`` for a device no input decides."""
        named = self.override_target()
        if named:
            return {named}
        out: set[str] = set()
        for cc in set(ccs):
            target, _ = self.decide(cc, toolkit=toolkit)
            out.add(target) if target else out.update(fallback)
        return out


def bundle_target_for(entries: dict[str, object], cc: Version) -> str | None:
    """Among a bundle index's entries: the target the SPEC policy picks for the nvcc that built it,
    else any that runs on the device. Pure."""
    candidates = [t for t in entries if target_runs_on(t, cc)]
    for target in candidates:
        entry = entries[target]
        built_with = entry.get("nvcc_version", "") if isinstance(entry, dict) else ""
        try:
            cuda = tuple(int(x) for x in str(built_with).split(".")[:2])
            if len(cuda) == 2 and select_target(cc, (cuda[0], cuda[1])) == target:
                return target
        except (ValueError, UnsupportedTarget):
            continue
    return candidates[0] if candidates else None


def one_target(gpus: tuple[GpuFacts, ...]) -> str:
    """The one target all these GPUs need: UnsupportedTarget naming a GPU without one, Inconclusive
    for GPUs that need different targets."""
    targets = {g.target for g in gpus}
    if None in targets:
        gpu = next(g for g in gpus if g.target is None)
        raise UnsupportedTarget(f"GPU {gpu.index} ({gpu.name}, cc {gpu.cc[0]}.{gpu.cc[1]}): {gpu.target_reason}")
    if len(targets) > 1:
        found = ", ".join(f"GPU {g.index} {g.name}: {g.target}" for g in gpus)
        raise Inconclusive(f"mixed node: its GPUs need different kernel targets ({found}); build each with --target")
    target = targets.pop()
    assert target is not None
    return target
