"""The node's fingerprint: what must not change between certification and serving. GPU uuids,
driver version, CUDA toolkit version, and for each kernel target the inputs of the library the node
would load: its build key (kdactl.jit.cache.build_key: sources, flags, target, kdactl version, the
nvcc that built it). Not the library's bytes: nvcc builds are not bit-identical, and a rebuild of the
same inputs (a corrupt cache entry is rebuilt) must not drain the node. The bytes are still checked:
a library is found only through its verified manifest, whose sha256 the library on disk must match,
so a tampered library is no library. The certificate also records that sha256, for the record.

Read without torch and without loading the library (``kdactl gate`` must answer in under a second):
GPUs and driver from NVML, the toolkit from ``nvcc --version``, the library from its verified cache
(or AOT) manifest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdactl.errors import KdactlError
from kdactl.settings import Settings

Version = tuple[int, int]


@dataclass(frozen=True)
class Artifact:
    """The kernel library of one target, from its verified manifest."""

    sha256: str  # its bytes (the library on disk matched this)
    build: str  # its inputs: kdactl.jit.cache.build_key


@dataclass(frozen=True)
class Fingerprint:
    gpu_uuids: tuple[str, ...]  # NVML index order
    driver_version: str | None
    cuda_toolkit: str | None  # "13.0"; None when there is no nvcc
    artifacts: Mapping[str, Artifact | None]  # kernel target -> its library (None: no valid library)
    why_none: Mapping[str, str] = field(default_factory=dict, compare=False)  # target -> why there is none

    def to_json(self) -> dict[str, Any]:
        """What the gate compares, with ``sha256`` over it (equal for a rebuild of the same inputs),
        and the library bytes certified, which the gate does not compare."""
        arts = dict(sorted(self.artifacts.items()))
        body = {
            "gpu_uuids": list(self.gpu_uuids),
            "driver_version": self.driver_version,
            "cuda_toolkit": self.cuda_toolkit,
            "artifact_build": {t: a and a.build for t, a in arts.items()},
        }
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return {
            **body,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "artifact_sha256": {t: a and a.sha256 for t, a in arts.items()},
        }


def find_artifact(settings: Settings, target: str, csrc: Path | None = None) -> tuple[Artifact | None, str]:
    """(the library the node would load for ``target``, "") or (None, why there is none).
    Mirrors kdactl.jit.library.open_kernels' order (AOT entry, else cache entry) but loads nothing
    and creates nothing. Only a verified entry counts: its manifest names these sources and flags,
    and every file's sha256 matches it."""
    from kdactl.jit import aot, cache
    from kdactl.jit.spec import kernel_library_spec
    from kdactl.targets import get_target

    try:
        spec = kernel_library_spec(get_target(target), csrc)
        if settings.aot_dir:
            entry = aot.find_entry(settings.aot_dir, spec)
            if entry is not None:
                return _artifact(entry.manifest)
        source_hash = spec.source_hash()
        key = spec.key_dir(settings.cache_dir, source_hash)
        found = cache.check_entry(key, target, source_hash)
    except (KdactlError, OSError) as err:
        return None, f"{target}: {err}"
    if not found.ok:
        return None, f"{target}: no valid library in the cache ({key}: {found.reason})"
    return _artifact(found.manifest or {})


def _artifact(manifest: Mapping[str, Any]) -> tuple[Artifact | None, str]:
    from kdactl.jit.cache import build_key

    try:
        return Artifact(str(manifest["files"][manifest["library"]]), build_key(manifest)), ""
    except (KeyError, TypeError, ValueError) as err:
        return None, f"the library manifest does not name the library's sha256 and build inputs ({err})"


def node_targets(
    settings: Settings, ccs: Iterable[Version], toolkit: Version | None, fallback: Iterable[str]
) -> set[str]:
    """The targets the node would load now (kdactl.jit.resolver: KDACTL_CUDA_ARCH, else an AOT entry
    for the device, else the SPEC policy with this nvcc); ``fallback`` (the certified targets) where
    none decides."""
    from kdactl.jit.resolver import TargetResolver

    return TargetResolver.from_settings(settings).targets_for(ccs, toolkit, fallback)


def artifacts_for(
    settings: Settings, targets: Iterable[str], csrc: Path | None = None
) -> tuple[dict[str, Artifact | None], dict[str, str]]:
    """(target -> its library or None, target -> why None)."""
    found: dict[str, Artifact | None] = {}
    why_none: dict[str, str] = {}
    for t in sorted(set(targets)):
        found[t], why = find_artifact(settings, t, csrc)
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
    # a certificate written before build keys were recorded names the library's bytes only
    field_, what = ("artifact_build", "build inputs") if "artifact_build" in recorded else ("artifact_sha256", "sha256")
    then_art = recorded.get(field_) or {}
    for target, art in sorted(now.artifacts.items()):
        before = then_art.get(target)
        cur = None if art is None else art.build if field_ == "artifact_build" else art.sha256
        if before is None:
            out.append(
                f"kernel library {target}: not certified (certificate covers {', '.join(sorted(then_art)) or 'no library'})"
            )
        elif cur is None:
            out.append(f"kernel library {target}: {what} {before[:16]}... at certification, no valid library now "
                       f"({now.why_none.get(target, 'not found')})")  # fmt: skip
        elif cur != before:
            hint = " (other sources, flags, kdactl or nvcc)" if field_ == "artifact_build" else ""
            out.append(
                f"kernel library {target} changed: {what} {before[:16]}... at certification, {cur[:16]}... now{hint}"
            )
    return out


def _uuid_changes(then: list[str], now: list[str]) -> list[str]:
    if len(then) != len(now):
        gone, new = [u for u in then if u not in now], [u for u in now if u not in then]
        said = "; ".join(
            p for p in (f"gone: {', '.join(gone)}" if gone else "", f"new: {', '.join(new)}" if new else "") if p
        )
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
