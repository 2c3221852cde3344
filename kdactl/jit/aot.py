"""AOT bundles: DIR/manifest.json (an index) and DIR/<target>/{libkdactl.so, manifest.json}.

A bundle is relocatable: every name in it is relative to DIR. Each DIR/<target>/ is checked
exactly like a cache entry (target, source hash of this kdactl's csrc, sha256 of the library), so a
node with no nvcc can load it, and a stale or damaged one is ignored with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdactl import __version__
from kdactl.atomic import write_json_atomic
from kdactl.errors import UnsafeCache
from kdactl.jit import cache
from kdactl.jit.spec import JitSpec

if TYPE_CHECKING:  # the builder (filelock, ninja's runner) is not imported to read a bundle: kdactl gate reads one
    from kdactl.jit.build import BuildResult

log = logging.getLogger("kdactl.jit")

AOT_SCHEMA = "kdactl.aot/v1"
INDEX = "manifest.json"


@dataclass(frozen=True)
class AotEntry:
    target: str
    directory: Path
    manifest: dict[str, Any]


def read_index(aot_dir: Path) -> dict[str, Any]:
    """The bundle's entries by target; {} (with a warning) when the index is missing or unreadable."""
    path = Path(aot_dir) / INDEX
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        log.warning("kdactl: AOT bundle %s has no %s; ignoring it", aot_dir, INDEX)
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        log.warning("kdactl: cannot read %s (%s); ignoring the AOT bundle", path, err)
        return {}
    if not isinstance(data, dict) or data.get("schema") != AOT_SCHEMA or not isinstance(data.get("entries"), dict):
        log.warning("kdactl: %s is not a %s index; ignoring the AOT bundle", path, AOT_SCHEMA)
        return {}
    return data["entries"]


def find_entry(aot_dir: Path, spec: JitSpec) -> AotEntry | None:
    """The bundle's entry for spec's target if it verifies against the current sources."""
    target = spec.target.name
    if target not in read_index(aot_dir):
        return None
    directory = Path(aot_dir) / target
    cache.check_private_dir(Path(aot_dir), shared=True)
    found = cache.check_entry(directory, target, spec.source_hash(), shared=True)
    if not found.ok:
        log.warning("kdactl: ignoring AOT entry %s: %s", directory, found.reason)
        return None
    return AotEntry(target, directory, found.manifest or {})


def write_bundle(aot_dir: Path, results: list[BuildResult]) -> Path:
    """Copy built cache entries into the bundle (each replaced atomically) and update its index."""
    aot_dir = Path(aot_dir)
    try:
        aot_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UnsafeCache(f"cannot create AOT directory {aot_dir}: {err.strerror}") from None
    cache.check_private_dir(aot_dir, shared=True)
    entries = {}
    if (aot_dir / INDEX).exists():  # keep the other targets already in the bundle
        entries = {t: e for t, e in read_index(aot_dir).items() if (aot_dir / t).is_dir()}
    for result in results:
        _publish_entry(aot_dir, result)
        entries[result.target] = {
            "path": f"{result.target}/{result.manifest['library']}",
            "sha256": result.manifest["files"][result.manifest["library"]],
            "source_hash": result.manifest["source_hash"],
            "nvcc_version": result.manifest["nvcc"]["version"],
            "built_at": result.manifest["built_at"],
        }
    index = {"schema": AOT_SCHEMA, "kdactl_version": __version__, "entries": dict(sorted(entries.items()))}
    write_json_atomic(aot_dir / INDEX, index, mode=0o644)
    return aot_dir / INDEX


def _publish_entry(aot_dir: Path, result: BuildResult) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{result.target}.tmp-", dir=aot_dir))
    try:
        for name in (result.manifest["library"], cache.MANIFEST):
            shutil.copyfile(result.directory / name, tmp / name)
            os.chmod(tmp / name, 0o644)
        os.chmod(tmp, 0o755)
        dest = aot_dir / result.target
        if dest.exists():
            cache.discard_dir(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
