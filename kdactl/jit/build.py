"""The one builder: build.ninja -> nvcc -> libkdactl.so in the cache, under a file lock, published
atomically with a manifest.

Concurrent builds of one key build once: the lock is an flock, which the kernel drops when its
holder dies, so a killed build never wedges the next one; whoever gets the lock checks the cache
again before building.

ninja runs in a session of its own, each compiler in a process group of its own within it: Ctrl-C,
SIGTERM or a time limit ends that whole session (kdactl.proc.kill_groups), so no nvcc outlives the
build, and the half-built temporary entry is removed.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import filelock

from kdactl.atomic import write_json_atomic
from kdactl.errors import BuildError, ToolMissing, UnsupportedTarget
from kdactl.hw.toolkit import Toolkit
from kdactl.jit import cache
from kdactl.jit.progress import NINJA_STATUS, BuildProgress, NinjaStep, NullProgress, parse_ninja_status
from kdactl.jit.spec import JitSpec
from kdactl.proc import LIVE, kill_groups, sigterm_interrupts

log = logging.getLogger("kdactl.jit")

LOCK_TIMEOUT_S = 1800.0  # the KDA kernels take minutes to compile on a small machine
BUILD_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class BuildResult:
    target: str
    directory: Path  # the cache entry
    manifest: dict[str, Any]
    built: bool  # False: it was already in the cache
    build_s: float

    @property
    def library(self) -> Path:
        return self.directory / self.manifest["library"]


def find_ninja() -> str:
    """The ninja binary: on PATH, else the one the `ninja` Python package ships."""
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # type: ignore[import-not-found]
    except ImportError:
        raise ToolMissing("ninja not found (install the 'ninja' Python package or put ninja on PATH)") from None
    return str(Path(ninja.BIN_DIR) / "ninja")


def check_toolkit(spec: JitSpec, toolkit: Toolkit) -> None:
    if toolkit.version < spec.target.min_cuda:
        need = ".".join(map(str, spec.target.min_cuda))
        raise UnsupportedTarget(f"nvcc {toolkit.version_str} cannot compile {spec.target.name} (needs CUDA >= {need})")


def lookup_cached(spec: JitSpec, cache_dir: Path) -> BuildResult | None:
    """The verified cache entry for spec, or None (missing or bad: build_library decides)."""
    digest = spec.source_hash()
    key = spec.key_dir(cache_dir, digest)
    cache.ensure_private_dirs(Path(cache_dir), key.parent)
    found = cache.check_entry(key, spec.target.name, digest)
    return BuildResult(spec.target.name, key, found.manifest or {}, built=False, build_s=0.0) if found.ok else None


def build_library(
    spec: JitSpec,
    cache_dir: Path,
    toolkit: Toolkit,
    *,
    lock_timeout: float = LOCK_TIMEOUT_S,
    jobs: int | None = None,
    progress: BuildProgress | None = None,
) -> BuildResult:
    """The cache entry for spec, built unless a verified one exists (ninja's steps reported to
    ``progress``). Never loads it. SIGTERM during the build ends it as Ctrl-C does: the
    compilers are ended and KeyboardInterrupt raised (kdactl.proc.sigterm_interrupts)."""
    check_toolkit(spec, toolkit)
    digest = spec.source_hash()
    key = spec.key_dir(cache_dir, digest)
    cache.ensure_private_dirs(Path(cache_dir), key.parent)
    found = cache.check_entry(key, spec.target.name, digest)
    if found.ok:
        return BuildResult(spec.target.name, key, found.manifest or {}, built=False, build_s=0.0)
    with _locked(key.parent / f"{key.name}.lock", lock_timeout):
        found = cache.check_entry(key, spec.target.name, digest)  # someone may have built it meanwhile
        if found.ok:
            return BuildResult(spec.target.name, key, found.manifest or {}, built=False, build_s=0.0)
        _clear_leftovers(key, found.reason)
        with sigterm_interrupts():
            return _build_and_publish(spec, toolkit, key, digest, jobs, progress or NullProgress())


class _locked:
    """filelock.FileLock with a clear BuildError on timeout; never a soft (stale-prone) lock."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout
        try:  # filelock >= 4 can fall back to a soft lock, which a killed holder leaves behind
            self.lock = filelock.FileLock(str(path), timeout=timeout, mode=0o600, fallback_to_soft=False)
        except TypeError:  # filelock 3.x: always flock on Unix
            self.lock = filelock.FileLock(str(path), timeout=timeout)

    def __enter__(self) -> _locked:
        try:
            self.lock.acquire()
        except filelock.Timeout:
            raise BuildError(
                f"timed out after {self.timeout:g} s waiting for the build lock {self.path}: "
                "another kdactl build of the same kernels is still running"
            ) from None
        except (OSError, NotImplementedError) as err:
            raise BuildError(f"cannot lock {self.path}: {err}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _clear_leftovers(key: Path, reason: str) -> None:
    """Under the lock: drop a bad entry (with a warning) and temp dirs of killed builds."""
    if key.exists():
        log.warning("kdactl: rebuilding cache entry %s: %s", key, reason)
        cache.discard_dir(key)
    for stale in key.parent.glob(f".{key.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _build_and_publish(spec: JitSpec, toolkit: Toolkit, key: Path, digest: str, jobs: int | None,
                       progress: BuildProgress) -> BuildResult:  # fmt: skip
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{key.name}.tmp-", dir=key.parent))
    try:
        write_build_ninja(spec, toolkit, tmp)
        progress.started(spec.target.name, len(spec.sources) + 1)  # build.ninja's edges: a compile per source, the link
        run_ninja(tmp, spec, jobs, lambda step: progress.step(spec.target.name, step))
        progress.finished(spec.target.name)
        for obj in tmp.glob("*.o"):
            obj.unlink()
        build_s = time.monotonic() - start
        manifest = make_manifest(spec, toolkit, digest, tmp, build_s)
        write_json_atomic(tmp / cache.MANIFEST, manifest, mode=0o600)
        os.chmod(tmp, cache.PRIVATE_MODE)
        os.replace(tmp, key)  # publish: readers see no entry or a whole one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("kdactl: built %s for %s in %.1f s", key, spec.target.name, build_s)
    return BuildResult(spec.target.name, key, manifest, built=True, build_s=build_s)


def _ninja_path(path: Path | str) -> str:
    return str(path).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def render_build_ninja(spec: JitSpec, nvcc: str) -> str:
    """One compile edge per .cu -> .o, one link edge -> lib<name>.so."""
    quote = lambda args: " ".join(shlex.quote(str(a)) for a in args)  # noqa: E731
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {shlex.quote(nvcc)}",
        f"cflags = {quote(spec.compile_flags())}",
        f"ldflags = {quote(spec.link_flags())}",
        "",
        "rule compile",
        "  command = $nvcc $cflags -c $src -o $out",
        "  description = NVCC $out",
        "rule link",
        "  command = $nvcc $ldflags $in -o $out",
        "  description = LINK $out",
        "",
    ]
    objects = []
    for source in spec.sources:
        obj = f"{source.stem}.o"
        objects.append(obj)
        deps = "".join(f" {_ninja_path(h)}" for h in spec.headers)
        lines.append(f"build {obj}: compile {_ninja_path(source)}" + (f" |{deps}" if deps else ""))
        lines.append(f"  src = {shlex.quote(str(source))}")
    lines.append(f"build {spec.so_name}: link {' '.join(objects)}")
    lines.append(f"default {spec.so_name}")
    return "\n".join(lines) + "\n"


def write_build_ninja(spec: JitSpec, toolkit: Toolkit, directory: Path) -> Path:
    path = directory / "build.ninja"
    path.write_text(render_build_ninja(spec, toolkit.nvcc))
    return path


def run_ninja(directory: Path, spec: JitSpec, jobs: int | None,
              on_step: Callable[[NinjaStep], None] = lambda step: None) -> None:  # fmt: skip
    """ninja in a session of its own (tracked in kdactl.proc.LIVE, so that a certify worker's
    SIGTERM handler ends it too), its output read as it comes for ``on_step`` and build.log; on any
    interruption or the time limit the whole session is ended before the exception leaves."""
    cmd = [find_ninja(), "-C", str(directory)] + ([f"-j{jobs}"] if jobs else [])
    env = {**os.environ, "NINJA_STATUS": NINJA_STATUS}
    proc = LIVE.start(lambda: subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    ))  # fmt: skip
    if proc is None:  # this process is being terminated (kdactl.proc.end_children_on_term)
        raise KeyboardInterrupt
    lines: list[str] = []
    reader = threading.Thread(target=_follow, args=(proc.stdout, lines, on_step), name="kdactl-ninja", daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_groups([proc])
        raise BuildError(f"building {spec.target.name} took over {BUILD_TIMEOUT_S:.0f} s; gave up") from None
    except BaseException:  # Ctrl-C, or SIGTERM through sigterm_interrupts
        kill_groups([proc])
        raise
    finally:
        LIVE.done(proc)
        reader.join(timeout=10)
    output = "".join(lines)
    (directory / "build.log").write_text(output)
    if returncode != 0:
        raise BuildError(f"nvcc failed for {spec.target.name} (ninja exit {returncode}): {first_errors(output)}")


def _follow(stream: Any, lines: list[str], on_step: Callable[[NinjaStep], None]) -> None:
    """Collect ninja's output, reporting each status line as it comes."""
    for line in stream:
        lines.append(line)
        step = parse_ninja_status(line)
        if step is None:
            continue
        try:
            on_step(step)
        except Exception as err:  # noqa: BLE001 - a display fault must not stop the reading, or ninja blocks on a full pipe
            log.debug("kdactl: build progress failed: %s", err)


def first_errors(output: str, limit: int = 5, width: int = 600) -> str:
    """The first compiler error lines (or the first lines) of a build log, as one line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and not ln.startswith(("FAILED:", "ninja:"))]
    text = " | ".join((errors or lines)[:limit]) or "no output"
    return text if len(text) <= width else text[: width - 3] + "..."


def make_manifest(spec: JitSpec, toolkit: Toolkit, digest: str, directory: Path, build_s: float) -> dict[str, Any]:
    """Relocatable: file names are relative to the entry; no path is needed to load it."""
    so = directory / spec.so_name
    return {
        "schema": cache.MANIFEST_SCHEMA,
        "name": spec.name,
        "target": spec.target.name,
        "kdactl_version": spec.version,
        "source_hash": digest,
        "library": spec.so_name,
        "files": {spec.so_name: cache.sha256_file(so)},
        "nvcc": {"path": toolkit.nvcc, "version": toolkit.version_str, "banner": toolkit.banner},
        "cflags": list(spec.cflags),
        "ldflags": list(spec.link_flags()),
        "sources": [p.relative_to(spec.root).as_posix() for p in spec.sources],
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_s": round(build_s, 3),
        "builder": {"host": socket.gethostname(), "pid": os.getpid()},
    }
