"""The per-user build cache: private directories, manifests, and checking an entry before use.

An entry is a directory <cache>/<kdactl version>/<target>/<name>-<hash16>/ holding the library and
manifest.json. It is trusted only when its manifest names the expected target and source hash and
every file's sha256 matches.

Every level of the cache, down to the library, is judged where it really is: a folder or file
reached through a symlink is judged by its real path, and each folder on that path must keep others
from replacing what it holds, or the symlink would lead code others control into the process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdactl.errors import UnsafeCache

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "kdactl.build/v1"
PRIVATE_MODE = 0o700


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_private_dir(path: Path, *, shared: bool = False) -> None:
    """Refuse a directory that group/other can write or (unless ``shared``, as an installed AOT
    bundle is) one that another user owns or this user cannot write."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise UnsafeCache(f"cannot use directory {path}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCache(f"{path} is not a directory")
    _check_mode_and_owner(path, st, shared, "directory", "use another directory")
    if not shared and not os.access(path, os.W_OK | os.X_OK):
        raise UnsafeCache(f"cache directory {path} is not writable by this user; set KDACTL_CACHE_DIR")


def ensure_private_dirs(root: Path, leaf: Path | None = None) -> None:
    """Create root and every directory down to leaf (mode 0700) where missing, and check each.

    Directories above root that kdactl has to create are made 0700 too; existing ones above root
    (say /tmp) are not kdactl's to judge.
    """
    root = Path(root)
    _make_dir(root)
    chain = [root]
    if leaf is not None:
        for part in Path(leaf).relative_to(root).parts:
            chain.append(chain[-1] / part)
    for directory in chain:
        _make_dir(directory)
        check_private_dir(directory)


def _make_dir(path: Path) -> None:
    if path.is_dir():
        return
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_MODE)
        except FileExistsError:
            continue  # another process made it first; check_private_dir judges it
        except OSError as err:
            raise UnsafeCache(
                f"cannot create cache directory {directory}: {err.strerror}; set KDACTL_CACHE_DIR"
            ) from None
        os.chmod(directory, PRIVATE_MODE)  # mkdir's mode is masked by the umask


def read_manifest(directory: Path) -> dict[str, Any]:
    """The entry's manifest; ValueError says why it cannot be read."""
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} cannot be read: {err}") from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise ValueError(f"{path} is not a {MANIFEST_SCHEMA} manifest")
    return data


def build_key(manifest: Mapping[str, Any]) -> str:
    """sha256 naming a build's inputs, from its manifest: the source hash (sources, headers, flags,
    target, kdactl version; JitSpec.source_hash) and the nvcc that compiled them (its --version
    banner; the version when there is none). Not the library's bytes, which differ from build to
    build of the same inputs. ValueError when the manifest lacks them."""
    nvcc = manifest.get("nvcc")
    toolchain = nvcc.get("banner") or nvcc.get("version") if isinstance(nvcc, dict) else None
    source_hash, target = manifest.get("source_hash"), manifest.get("target")
    if not all(isinstance(v, str) and v for v in (source_hash, target, toolchain)):
        raise ValueError("manifest lacks source_hash, target or nvcc")
    text = json.dumps({"source_hash": source_hash, "target": target, "nvcc": toolchain}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class EntryCheck:
    ok: bool
    reason: str  # why not, for the warning; "" when ok
    manifest: dict[str, Any] | None = None


def check_entry(directory: Path, target: str, source_hash: str | None, *, shared: bool = False) -> EntryCheck:
    """Is the entry complete, for this target (and source hash, when given), with files intact?
    UnsafeCache when the entry folder or one of its files is one that others could have changed
    (every level down to the library is checked: a safe parent does not make a writable leaf safe);
    ``shared`` as in check_private_dir."""
    if not Path(directory).is_dir():
        return EntryCheck(False, "not built yet")
    check_private_dir(Path(directory), shared=shared)
    try:
        manifest = read_manifest(directory)
    except ValueError as err:
        return EntryCheck(False, str(err))
    if manifest.get("target") != target:
        return EntryCheck(False, f"manifest target is {manifest.get('target')!r}, expected {target!r}")
    if source_hash is not None and manifest.get("source_hash") != source_hash:
        return EntryCheck(False, "manifest source hash does not match the current sources and flags")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return EntryCheck(False, "manifest lists no files")
    for name, expected in files.items():
        reason = _check_file(Path(directory), name, expected, shared)
        if reason:
            return EntryCheck(False, reason)
    return EntryCheck(True, "", manifest)


def _check_file(directory: Path, name: str, expected: Any, shared: bool) -> str:
    path = directory / name
    if Path(name).is_absolute() or ".." in Path(name).parts:
        return f"manifest file name {name!r} leaves the entry"
    if not path.is_file():
        return f"{path} is missing"
    _check_mode_and_owner(path, os.stat(path), shared, "file", "remove the entry")
    actual = sha256_file(path)
    if actual != expected:
        return f"{path} sha256 {actual[:16]}... does not match the manifest's {str(expected)[:16]}..."
    return ""


def _check_mode_and_owner(path: Path, st: os.stat_result, shared: bool, what: str, other_fix: str) -> None:
    """One rule for every level of the cache, folders and files alike (unsafe_mode_or_owner), and
    for a level reached through a symlink, one more for every folder on its real path."""
    real = _real_path(path)
    shown = f"{path}" if real is None else f"{path} resolves to {real}, which"
    writable = writable_by_others(st.st_mode)
    if writable:
        raise UnsafeCache(f"{what} {shown} {writable}; refusing to load code from it; "
                          f"run 'chmod go-w {real or path}' or {other_fix}")  # fmt: skip
    foreign = foreign_owner(st.st_uid, os.geteuid(), shared=shared)
    if foreign:
        raise UnsafeCache(f"cache {what} {shown} {foreign}; set KDACTL_CACHE_DIR to a directory of your own")
    for folder in real.parents if real is not None else ():
        folder_st = os.stat(folder)
        problem = unsafe_mode_or_owner(folder_st.st_mode, folder_st.st_uid, os.geteuid(), shared=shared, above=True)
        if problem:
            raise UnsafeCache(f"{what} {path} resolves to {real}, and {folder} {problem}, so others could replace "
                              "what the symlink leads to; refusing to load code through it; point the symlink "
                              "into a folder only you (or root) can write")  # fmt: skip


def _real_path(path: Path) -> Path | None:
    """Where a path reached through a symlink (its own or a parent's) really is; None otherwise."""
    real = Path(os.path.realpath(path))
    return None if real == Path(os.path.abspath(path)) else real


def unsafe_mode_or_owner(mode: int, uid: int, euid: int, *, shared: bool, above: bool = False) -> str:
    """Why others could change a cache folder or file with this mode and owner ("" if they cannot):
    nobody but its owner may write it, and (unless ``shared``, as an installed AOT bundle is) that
    owner is this user. A folder ``above`` it on a symlink's real path need only keep others from
    replacing what it holds: sticky when others can write it (as /tmp), and owned by this user or
    root (unless ``shared``)."""
    return writable_by_others(mode, above=above) or foreign_owner(uid, euid, shared=shared, above=above)


def writable_by_others(mode: int, *, above: bool = False) -> str:
    """unsafe_mode_or_owner's rule on the mode alone ("" when it holds)."""
    if mode & 0o022 and not (above and mode & stat.S_ISVTX):
        return f"is writable by group or other (mode {oct(mode & 0o7777)})"
    return ""


def foreign_owner(uid: int, euid: int, *, shared: bool, above: bool = False) -> str:
    """unsafe_mode_or_owner's rule on the owner alone ("" when it holds)."""
    if not shared and uid != euid and not (above and uid == 0):
        return f"is owned by uid {uid}, not this user (uid {euid})"
    return ""


def discard_dir(path: Path) -> None:
    """Move a directory out of the way (atomic), then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.trash-", dir=path.parent))
    os.replace(path, trash / "old")
    shutil.rmtree(trash, ignore_errors=True)
