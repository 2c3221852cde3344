"""Kernel target policy: compute capability x CUDA toolkit -> one nvcc target (SPEC table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kdactl.errors import UnsupportedTarget, UsageError

Version = tuple[int, int]


@dataclass(frozen=True)
class Target:
    name: str  # e.g. "sm_90a"
    min_cuda: Version  # oldest toolkit that can compile it
    portable_only: bool = False  # only the routes with no arch-specific code

    @property
    def arch(self) -> int:
        """Numeric SM of the target (90 for sm_90a)."""
        return int("".join(c for c in self.name[3:] if c.isdigit()))

    @property
    def gencode(self) -> str:
        """The one -gencode flag nvcc gets. A target without an a/f suffix also embeds its PTX, which
        the driver can compile for a later GPU; arch-specific PTX runs on its own architecture only."""
        virtual = self.name.replace("sm_", "compute_")
        code = f"[{self.name},{virtual}]" if self.name[-1].isdigit() else self.name
        return f"-gencode=arch={virtual},code={code}"

    @property
    def define(self) -> str:
        """The -D macro the kernels guard their arch-specific paths with (csrc/common.cuh)."""
        return "KDACTL_TARGET_" + self.name.upper().replace("_", "")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", (12, 0), portable_only=True),
        Target("sm_90a", (12, 0)),
        Target("sm_100a", (12, 8)),
        Target("sm_100f", (12, 9)),
        Target("sm_120a", (12, 8)),
        Target("sm_120f", (12, 9)),
    )
}

# Which device compute capabilities each target's code runs on.
RUNS_ON: dict[str, frozenset[Version]] = {
    "sm_80": frozenset({(8, 0), (8, 6), (8, 9)}),
    "sm_90a": frozenset({(9, 0)}),
    "sm_100a": frozenset({(10, 0)}),
    "sm_100f": frozenset({(10, 0), (10, 3)}),
    "sm_120a": frozenset({(12, 0)}),
    "sm_120f": frozenset({(12, 0)}),
}


def _pair(version: Sequence[int]) -> Version:
    """(major, minor) of a version given as any sequence (JSON gives lists; a patch level is ignored)."""
    return int(version[0]), int(version[1])


def select_target(cc: Version, cuda: Version) -> str:
    """The SPEC target policy. Raises UnsupportedTarget with the reason."""
    cc, cuda = _pair(cc), _pair(cuda)
    if cuda < (12, 0):
        raise UnsupportedTarget(f"CUDA toolkit {_v(cuda)} is older than 12.0; no target for cc {_v(cc)}")
    if cc == (9, 0):
        return "sm_90a"
    if cc in ((8, 0), (8, 6), (8, 9)):
        return "sm_80"
    if cc in ((10, 0), (10, 3)):
        if cuda >= (12, 9):
            return "sm_100f"
        if cc == (10, 0) and cuda == (12, 8):
            return "sm_100a"
        raise UnsupportedTarget(f"cc {_v(cc)} needs CUDA toolkit >= 12.9 (or 12.8 for cc 10.0), found {_v(cuda)}")
    if cc == (12, 0):
        if cuda >= (12, 9):
            return "sm_120f"
        if cuda == (12, 8):
            return "sm_120a"
        raise UnsupportedTarget(f"cc 12.0 needs CUDA toolkit >= 12.8, found {_v(cuda)}")
    raise UnsupportedTarget(f"no kernel target for compute capability {_v(cc)}")


def decide_target(cc: Version, *, override: str | None = None, aot: str | None = None, toolkit: Version | None = None,
                  driver_cuda: Version | None = None) -> tuple[str | None, str]:  # fmt: skip
    """The policy's decision: (target, how it was chosen) or (None, why there is none). Pure; its one
    caller is kdactl.jit.resolver.TargetResolver, which gathers these inputs.

    KDACTL_CUDA_ARCH (``override``), else the AOT bundle's entry for this device (``aot``: it is
    what the loader would load), else the SPEC policy with the nvcc's CUDA (``toolkit``), else with
    the driver's CUDA, which only a prebuilt bundle can serve."""
    if override:
        return get_target(override).name, f"KDACTL_CUDA_ARCH={override}"
    if aot:
        return get_target(aot).name, f"the AOT bundle's entry for cc {cc[0]}.{cc[1]}"
    if toolkit is not None:
        cuda, basis = toolkit, f"CUDA toolkit {toolkit[0]}.{toolkit[1]} (nvcc)"
    elif driver_cuda is not None:
        cuda, basis = (
            driver_cuda,
            f"the driver's CUDA {driver_cuda[0]}.{driver_cuda[1]} (no nvcc: a prebuilt AOT bundle must serve it)",
        )
    else:
        return None, "no CUDA toolkit (nvcc) and no driver CUDA version to choose a target with"
    try:
        return select_target(cc, cuda), f"cc {cc[0]}.{cc[1]} with {basis}"
    except UnsupportedTarget as err:
        return None, str(err)


def get_target(name: str) -> Target:
    """Look a target up by name; an unknown name is a usage error."""
    key = name.strip()
    if key not in TARGETS:
        raise UsageError(f"unknown kernel target {name!r}; known: {', '.join(TARGETS)}")
    return TARGETS[key]


def parse_target_list(text: str) -> list[Target]:
    """'sm_90a,sm_100f' -> targets, in order, without duplicates."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--target needs at least one target name")
    return [get_target(n) for n in dict.fromkeys(names)]


def target_runs_on(target: str, cc: Version) -> bool:
    return tuple(cc) in RUNS_ON.get(target, frozenset())


def _v(v: Version) -> str:
    return f"{v[0]}.{v[1]}"
