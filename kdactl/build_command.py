"""``kdactl build``: build or load the kernel library for this node and run its self-test, or
compile named targets only (no GPU needed), optionally writing an AOT bundle."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS, NoGpu
from kdactl.hw.toolkit import find_toolkit
from kdactl.jit import aot
from kdactl.jit.build import BuildResult, build_library, lookup_cached
from kdactl.jit.library import Kernels, ToolkitProvider, open_kernels
from kdactl.jit.progress import BuildProgress, NullProgress, make_progress
from kdactl.jit.resolver import TargetResolver
from kdactl.jit.selftest import SelftestResult, run_selftest
from kdactl.jit.spec import kernel_library_spec
from kdactl.node import NodeFacts, gather_node
from kdactl.settings import Settings
from kdactl.targets import Target, get_target, parse_target_list


@dataclass(frozen=True)
class LibraryInfo:
    target: str
    path: Path
    origin: str  # "built", "cache", "aot"
    build_s: float
    load_s: float | None  # None: compiled only, not loaded
    manifest: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "path": str(self.path),
            "origin": self.origin,
            "from_cache": self.origin != "built",
            "build_s": round(self.build_s, 3),
            "load_s": None if self.load_s is None else round(self.load_s, 4),
            "manifest": self.manifest,
        }


@dataclass(frozen=True)
class BuildReport:
    mode: str  # "node": build/load + self-test; "compile": named targets, compile only
    libraries: tuple[LibraryInfo, ...]
    selftests: tuple[SelftestResult, ...] = ()
    aot_manifest: Path | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        if self.mode == "compile":
            return EXIT_PASS if self.libraries else EXIT_INCONCLUSIVE
        if not self.selftests:
            return EXIT_INCONCLUSIVE  # no evidence is not a pass
        return EXIT_PASS if all(t.passed for t in self.selftests) else EXIT_NOT_CERTIFIED

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "build",
            "mode": self.mode,
            "passed": self.exit_code == EXIT_PASS,
            "exit_code": self.exit_code,
            "libraries": [lib.to_json() for lib in self.libraries],
            "selftests": [t.to_json() for t in self.selftests],
            "aot_manifest": None if self.aot_manifest is None else str(self.aot_manifest),
            "notes": list(self.notes),
        }

    def render(self, console: Console) -> None:
        for lib in self.libraries:
            how = {"built": f"built in {lib.build_s:.1f} s", "cache": "from cache", "aot": "from AOT bundle"}[
                lib.origin
            ]
            load = "" if lib.load_s is None else f", loaded in {lib.load_s * 1000:.0f} ms"
            console.print(f"{lib.target}: {lib.path} ({how}{load})", markup=False)
        for t in self.selftests:
            verdict = "PASS" if t.passed else f"FAIL: {t.mismatches} of {t.n} values wrong, first {t.first_mismatch}"
            console.print(f"self-test cuda:{t.device}: {verdict} ({t.duration_s * 1000:.0f} ms)", markup=False)
        if self.aot_manifest is not None:
            console.print(f"AOT bundle: {self.aot_manifest}", markup=False)
        for note in self.notes:
            console.print(note, markup=False)


NodeProvider = Callable[[Settings], NodeFacts]
Loader = Callable[[Settings, str, ToolkitProvider, "Path | None", BuildProgress], Kernels]
SelftestRunner = Callable[[Kernels, int], SelftestResult]


def _torch_devices() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def build_command(
    settings: Settings,
    targets: str | None = None,
    aot_dir: Path | None = None,
    *,
    node_provider: NodeProvider = gather_node,
    toolkit_provider: ToolkitProvider = find_toolkit,
    loader: Loader = open_kernels,
    selftest: SelftestRunner = run_selftest,
    devices: Callable[[], list[int]] = _torch_devices,
    csrc: Path | None = None,
    as_json: bool = False,
    progress: NullProgress | None = None,
) -> BuildReport:
    """No targets: this node's target, built or loaded, self-tested on every visible GPU.
    Targets ("sm_90a,sm_100f"): compile each, load nothing. Builds report ninja's progress
    (kdactl.jit.progress.make_progress unless ``progress`` is given)."""
    prog = progress or make_progress(as_json)
    with closing(prog):
        if targets is not None:
            return compile_targets(settings, parse_target_list(targets), aot_dir, toolkit_provider, csrc, prog)
        target = node_target(settings, node_provider)
        kernels = loader(settings, target, toolkit_provider, csrc, prog)
        indices = devices()
        if not indices:
            raise NoGpu(f"torch sees no CUDA device, so the {target} library cannot be self-tested")
        results = tuple(selftest(kernels, i) for i in indices)
        library = LibraryInfo(target, kernels.path, kernels.origin, kernels.build_s, kernels.load_s, kernels.manifest)
        bundle = None
        if aot_dir is not None:
            bundle = aot.write_bundle(aot_dir, [_built(settings, get_target(target), toolkit_provider, csrc, prog)])
    return BuildReport("node", (library,), results, bundle)


def compile_targets(
    settings: Settings,
    targets: list[Target],
    aot_dir: Path | None = None,
    toolkit_provider: ToolkitProvider = find_toolkit,
    csrc: Path | None = None,
    progress: BuildProgress | None = None,
) -> BuildReport:
    """Compile only: each target's library into the cache (and the AOT bundle); nothing is loaded."""
    toolkit = toolkit_provider(settings.nvcc)
    results = [
        build_library(kernel_library_spec(t, csrc), settings.cache_dir, toolkit, progress=progress) for t in targets
    ]
    libraries = tuple(
        LibraryInfo(r.target, r.library, "built" if r.built else "cache", r.build_s, None, r.manifest) for r in results
    )
    bundle = aot.write_bundle(aot_dir, results) if aot_dir is not None else None
    return BuildReport("compile", libraries, (), bundle)


def node_target(settings: Settings, node_provider: NodeProvider) -> str:
    """KDACTL_CUDA_ARCH, else the one target every GPU of this node needs."""
    return TargetResolver.from_settings(settings).node_target(lambda: node_provider(settings).require_gpus())


def _built(settings: Settings, target: Target, toolkit_provider: ToolkitProvider, csrc: Path | None,
           progress: BuildProgress) -> BuildResult:  # fmt: skip
    """The cache entry for target, building it if needed (AOT bundles copy from the cache)."""
    spec = kernel_library_spec(target, csrc)
    return lookup_cached(spec, settings.cache_dir) or build_library(
        spec, settings.cache_dir, toolkit_provider(settings.nvcc), progress=progress
    )
