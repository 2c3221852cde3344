"""The node's fingerprint: what must not change between certification and serving. GPU uuids,
driver version, CUDA toolkit version, and the sha256 of the kernel library the node would load.

Read without torch and without loading the library (``kdactl gate`` must answer in under a second):
GPUs and driver from NVML, the toolkit from ``nvcc --version``, the library's sha256 from its
verified cache (or AOT) manifest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kdactl.errors import KdactlError
from kdactl.settings import Settings

Version = tuple[int, int]


@dataclass(frozen=True)
class Fingerprint:
    gpu_uuids: tuple[str, ...]  # NVML index order
    driver_version: str | None
    cuda_toolkit: str | None  # "13.0"; None when there is no nvcc
    artifacts: Mapping[str, str | None]  # kernel target -> library sha256 (None: no valid library)
    why_none: Mapping[str, str] = field(default_factory=dict, compare=False)  # target -> why its sha256 is None

    def to_json(self) -> dict[str, Any]:
        body = {
            "gpu_uuids": list(self.gpu_uuids),
            "driver_version": self.driver_version,
            "cuda_toolkit": self.cuda_toolkit,
            "artifact_sha256": dict(sorted(self.artifacts.items())),
        }
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return {**body, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def artifact_sha256(settings: Settings, target: str, csrc: Path | None = None) -> tuple[str | None, str]:
    """(sha256 of the library the node would load for ``target``, "") or (None, why there is none).
    Mirrors kdactl.jit.library.open_kernels' order (AOT entry, else cache entry) but loads nothing
    and creates nothing."""
    from kdactl.jit import aot, cache
    from kdactl.jit.spec import kernel_library_spec
    from kdactl.targets import get_target

    try:
        spec = kernel_library_spec(get_target(target), csrc)
        if settings.aot_dir:
            entry = aot.find_entry(settings.aot_dir, spec)
            if entry is not None:
                return _library_sha(entry.manifest)
        source_hash = spec.source_hash()
        key = spec.key_dir(settings.cache_dir, source_hash)
        found = cache.check_entry(key, target, source_hash)
    except (KdactlError, OSError) as err:
        return None, f"{target}: {err}"
    if not found.ok:
        return None, f"{target}: no valid library in the cache ({key}: {found.reason})"
    return _library_sha(found.manifest or {})


def _library_sha(manifest: Mapping[str, Any]) -> tuple[str | None, str]:
    try:
        return str(manifest["files"][manifest["library"]]), ""
    except (KeyError, TypeError):
        return None, "the library manifest names no library sha256"


def node_targets(settings: Settings, ccs: Iterable[Version], toolkit: Version | None, fallback: Iterable[str]) -> set[str]:
    """The targets the node would load now: KDACTL_CUDA_ARCH, else an AOT entry for the device,
    else the SPEC policy with this nvcc; ``fallback`` (the certified targets) where none decides."""
    from kdactl.targets import decide_target, get_target

    if settings.cuda_arch:
        return {get_target(settings.cuda_arch).name}
    out: set[str] = set()
    for cc in set(ccs):
        found = None
        if settings.aot_dir:
            from kdactl.jit import aot

            found = aot.target_for_device(settings.aot_dir, cc)
        target, _ = decide_target(cc, aot=found, toolkit=toolkit)
        out.add(target) if target else out.update(fallback)
    return out


def artifacts_for(settings: Settings, targets: Iterable[str], csrc: Path | None = None) -> tuple[dict[str, str | None], dict[str, str]]:
    """(target -> sha256 or None, target -> why None)."""
    found: dict[str, str | None] = {}
    why_none: dict[str, str] = {}
    for t in sorted(set(targets)):
        found[t], why = artifact_sha256(settings, t, csrc)
        if why:
            why_none[t] = why
    return found, why_none


def compare(recorded: Mapping[str, Any], now: Fingerprint) -> list[str]:
    """One line per difference between the certificate's fingerprint and the node's now."""
    out = []
    then_uuids = list(recorded.get("gpu_uuids") or [])
    if then_uuids != list(now.gpu_uuids):
        out += _uuid_changes(then_uuids, list(now.gpu_uuids))
    for key, label in (("driver_version", "driver"), ("cuda_toolkit", "CUDA toolkit (nvcc)")):
        then, cur = recorded.get(key), getattr(now, key)
        if then != cur:
            out.append(f"{label} changed: {then or 'none'} at certification, {cur or 'none'} now")
    then_art = recorded.get("artifact_sha256") or {}
    for target, sha in sorted(now.artifacts.items()):
        before = then_art.get(target)
        if before is None:
            out.append(f"kernel library {target}: not certified (certificate covers {', '.join(sorted(then_art)) or 'no library'})")
        elif sha is None:
            out.append(f"kernel library {target}: sha256 {before[:16]}... at certification, none now ({now.why_none.get(target, 'not found')})")
        elif sha != before:
            out.append(f"kernel library {target} changed: sha256 {before[:16]}... at certification, {sha[:16]}... now")
    return out


def _uuid_changes(then: list[str], now: list[str]) -> list[str]:
    if len(then) != len(now):
        gone, new = [u for u in then if u not in now], [u for u in now if u not in then]
        said = "; ".join(p for p in (f"gone: {', '.join(gone)}" if gone else "", f"new: {', '.join(new)}" if new else "") if p)
        return [f"GPU count changed: {len(then)} at certification, {len(now)} now ({said or 'same uuids'})"]
    return [f"GPU {i}: uuid {a} at certification, {b} now" for i, (a, b) in enumerate(zip(then, now)) if a != b]


@dataclass(frozen=True)
class NodeNow:
    """What NVML and nvcc say now: the inputs of a fingerprint."""

    gpu_uuids: tuple[str, ...]
    ccs: tuple[Version, ...]
    driver_version: str | None
    toolkit: Version | None


def read_node_now(settings: Settings, driver_reader: Callable[[], Any] | None = None,
                  toolkit_reader: Callable[[str], Any] | None = None) -> NodeNow:  # fmt: skip
    """NVML (raises NoGpu / Inconclusive: the gate cannot tell) and nvcc (missing: toolkit None)."""
    from kdactl.errors import ToolMissing

    if driver_reader is None:
        from kdactl.hw.nvml import PynvmlDriver

        driver_reader = PynvmlDriver().read
    if toolkit_reader is None:
        from kdactl.hw.toolkit import find_toolkit

        toolkit_reader = find_toolkit
    info = driver_reader()
    try:
        toolkit = toolkit_reader(settings.nvcc).version
    except ToolMissing:
        toolkit = None
    return NodeNow(tuple(g.uuid for g in info.gpus), tuple(g.cc for g in info.gpus), info.driver_version, toolkit)
