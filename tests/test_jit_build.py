"""kdactl.jit.build and kdactl.jit.cache: the builder, the cache's safety and its entries.

CPU tests use a fake toolkit; the tests that compile use the real nvcc on a tiny csrc copy."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kdactl.errors import EXIT_USAGE, BuildError, UnsafeCache, UnsupportedTarget
from kdactl.hw.toolkit import Toolkit
from kdactl.jit import cache
from kdactl.jit.build import _locked, build_library, first_errors, lookup_cached
from kdactl.jit.spec import kernel_library_spec
from kdactl.targets import get_target
from tests.fakes import write_fake_nvcc

FAKE_TOOLKIT = Toolkit(nvcc="/nonexistent/nvcc", version=(13, 0), banner="fake")


def _spec(csrc, target="sm_90a"):
    return kernel_library_spec(get_target(target), csrc)


# --- cache directory safety ----------------------------------------------------------------------


def test_cache_dirs_are_created_private(tmp_path):
    root = tmp_path / "home" / ".cache" / "kdactl"
    leaf = root / "0.1.0" / "sm_90a"
    cache.ensure_private_dirs(root, leaf)
    for d in (root, root / "0.1.0", leaf, root.parent):
        assert d.stat().st_mode & 0o777 == 0o700


def test_group_writable_cache_dir_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o775)
    with pytest.raises(UnsafeCache, match="writable by group or other") as err:
        cache.ensure_private_dirs(root, root / "0.1.0")
    assert err.value.exit_code == EXIT_USAGE
    assert "\n" not in str(err.value)


def test_other_writable_subdir_is_refused(tmp_path):
    root = tmp_path / "cache"
    (root / "0.1.0").mkdir(parents=True)
    os.chmod(root, 0o700)
    os.chmod(root / "0.1.0", 0o707)
    with pytest.raises(UnsafeCache, match="0.1.0"):
        cache.ensure_private_dirs(root, root / "0.1.0" / "sm_90a")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_cache_dir_owned_by_another_user_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(UnsafeCache, match="owned by uid 12345"):
        cache.ensure_private_dirs(root)


def test_uncreatable_cache_dir_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UnsafeCache, match="cannot create cache directory") as err:
        cache.ensure_private_dirs(blocker / "kdactl")
    assert "\n" not in str(err.value)


def test_build_refuses_unsafe_cache_before_compiling(tmp_path, tiny_csrc):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UnsafeCache):
        build_library(_spec(tiny_csrc), root, FAKE_TOOLKIT)  # the fake nvcc is never run
    assert list(root.iterdir()) == []


def test_toolkit_too_old_for_target(tmp_path, tiny_csrc):
    old = Toolkit(nvcc="/x/nvcc", version=(12, 8), banner="")
    with pytest.raises(UnsupportedTarget, match="nvcc 12.8 cannot compile sm_100f"):
        build_library(_spec(tiny_csrc, "sm_100f"), tmp_path / "c", old)


# --- entries and manifests -----------------------------------------------------------------------


def _fake_entry(directory: Path, target="sm_90a", source_hash="abc", payload=b"ELF"):
    directory.mkdir(parents=True)
    (directory / "libkdactl.so").write_bytes(payload)
    manifest = {
        "schema": cache.MANIFEST_SCHEMA,
        "target": target,
        "source_hash": source_hash,
        "library": "libkdactl.so",
        "files": {"libkdactl.so": cache.sha256_file(directory / "libkdactl.so")},
    }
    (directory / cache.MANIFEST).write_text(json.dumps(manifest))
    return manifest


def test_check_entry_accepts_a_good_entry(tmp_path):
    _fake_entry(tmp_path / "e")
    assert cache.check_entry(tmp_path / "e", "sm_90a", "abc").ok


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: (d / "libkdactl.so").write_bytes(b"corrupt"), "sha256"),
        (lambda d: (d / "libkdactl.so").unlink(), "missing"),
        (lambda d: (d / cache.MANIFEST).unlink(), "manifest.json is missing"),
        (lambda d: (d / cache.MANIFEST).write_text("{not json"), "cannot be read"),
    ],
)
def test_check_entry_rejects_damage(tmp_path, damage, reason):
    _fake_entry(tmp_path / "e")
    damage(tmp_path / "e")
    found = cache.check_entry(tmp_path / "e", "sm_90a", "abc")
    assert not found.ok and reason in found.reason


def test_check_entry_rejects_other_target_or_sources(tmp_path):
    _fake_entry(tmp_path / "e", target="sm_100f")
    assert "expected 'sm_90a'" in cache.check_entry(tmp_path / "e", "sm_90a", "abc").reason
    assert "source hash" in cache.check_entry(tmp_path / "e", "sm_100f", "other").reason


def test_check_entry_rejects_paths_leaving_the_entry(tmp_path):
    manifest = _fake_entry(tmp_path / "e")
    manifest["files"] = {"../evil.so": "0"}
    (tmp_path / "e" / cache.MANIFEST).write_text(json.dumps(manifest))
    assert "leaves the entry" in cache.check_entry(tmp_path / "e", "sm_90a", "abc").reason


def test_first_errors_picks_compiler_errors():
    log = textwrap.dedent(
        """\
        [1/3] NVCC library.o
        FAILED: selftest.o
        /usr/local/bin/nvcc -c selftest.cu -o selftest.o
        selftest.cu(3): error: identifier "oops" is undefined
        1 error detected in the compilation of "selftest.cu".
        ninja: build stopped: subcommand failed.
        """
    )
    text = first_errors(log)
    assert text.startswith('selftest.cu(3): error: identifier "oops" is undefined')
    assert "\n" not in text and "ninja:" not in text


# --- the lock ------------------------------------------------------------------------------------

_HOLDER = """
import sys, time
from pathlib import Path
from kdactl.jit.build import _locked
held = _locked(Path(sys.argv[1]), 5.0).__enter__()
print("held", flush=True)
time.sleep(600)
"""


def _hold_lock(path: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_lock_of_a_live_build_times_out_with_a_clear_message(tmp_path):
    child = _hold_lock(tmp_path / "k.lock")
    try:
        with pytest.raises(BuildError, match=r"timed out after 0.3 s waiting for the build lock .*k\.lock"):
            with _locked(tmp_path / "k.lock", 0.3):
                pass
    finally:
        child.kill()
        child.wait()


def test_lock_of_a_killed_build_does_not_wedge(tmp_path):
    child = _hold_lock(tmp_path / "k.lock")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert (tmp_path / "k.lock").exists()  # the file stays; the kernel dropped the flock
    start = time.monotonic()
    with _locked(tmp_path / "k.lock", 5.0):
        pass
    assert time.monotonic() - start < 2.0


# --- builds with a fake nvcc ----------------------------------------------------------------------


def test_fake_build_reports_every_ninja_step_and_publishes(tmp_path, tiny_csrc):
    spec = _spec(tiny_csrc)
    toolkit = Toolkit(str(write_fake_nvcc(tmp_path)), (13, 0), "fake")
    steps = []

    class Recorder:
        def started(self, target, edges):
            steps.append((target, edges))

        def step(self, target, step):
            steps.append((target, step.done, step.total, step.what))

        def finished(self, target):
            steps.append((target, "finished"))

    result = build_library(spec, tmp_path / "cache", toolkit, progress=Recorder())
    edges = len(spec.sources) + 1
    assert steps[0] == ("sm_90a", edges) and steps[-1] == ("sm_90a", "finished")
    assert [s[1] for s in steps[1:-1]] == list(range(1, edges + 1))
    assert steps[-2] == ("sm_90a", edges, edges, "LINK libkdactl.so")
    assert result.built and cache.check_entry(result.directory, "sm_90a", spec.source_hash()).ok


def test_fake_compile_failure_is_reported_and_nothing_published(tmp_path, tiny_csrc):
    spec = _spec(tiny_csrc)
    toolkit = Toolkit(str(write_fake_nvcc(tmp_path, error="kda.cu(9): error: oops_undefined")), (13, 0), "fake")
    with pytest.raises(BuildError, match=r"nvcc failed for sm_90a \(ninja exit 1\): kda.cu\(9\): error: oops_undefined"):
        build_library(spec, tmp_path / "cache", toolkit)
    key = spec.key_dir(tmp_path / "cache")
    assert [p.name for p in key.parent.iterdir()] == [f"{key.name}.lock"]


# --- real builds (nvcc) --------------------------------------------------------------------------


def test_build_then_cache_hit(tmp_path, tiny_csrc, nvcc_toolkit):
    spec = _spec(tiny_csrc)
    first = build_library(spec, tmp_path / "cache", nvcc_toolkit)
    assert first.built and first.library.is_file()
    assert first.directory == spec.key_dir(tmp_path / "cache")
    manifest = json.loads((first.directory / "manifest.json").read_text())
    assert manifest["target"] == "sm_90a" and manifest["source_hash"] == spec.source_hash()
    assert manifest["nvcc"]["version"] == nvcc_toolkit.version_str
    assert manifest["files"]["libkdactl.so"] == cache.sha256_file(first.library)
    assert not list(first.directory.glob("*.o"))
    second = build_library(spec, tmp_path / "cache", nvcc_toolkit)
    assert not second.built and second.manifest["built_at"] == manifest["built_at"]
    assert lookup_cached(spec, tmp_path / "cache").directory == first.directory


def test_corrupt_library_is_rebuilt_with_a_warning(tmp_path, tiny_csrc, nvcc_toolkit, caplog):
    spec = _spec(tiny_csrc)
    first = build_library(spec, tmp_path / "cache", nvcc_toolkit)
    first.library.write_bytes(b"\x7fELF truncated")
    leftover = first.directory.parent / f".{first.directory.name}.tmp-killed"
    leftover.mkdir()  # what a killed build leaves behind
    assert lookup_cached(spec, tmp_path / "cache") is None
    again = build_library(spec, tmp_path / "cache", nvcc_toolkit)
    assert again.built
    assert cache.check_entry(again.directory, "sm_90a", spec.source_hash()).ok
    assert "rebuilding cache entry" in caplog.text and "sha256" in caplog.text
    assert not leftover.exists()


def test_compile_error_is_reported_and_nothing_published(tmp_path, tiny_csrc, nvcc_toolkit):
    (tiny_csrc / "broken.cu").write_text('#include "common.cuh"\nint f() { return oops_undefined; }\n')
    spec = _spec(tiny_csrc)
    with pytest.raises(BuildError, match="nvcc failed for sm_90a.*oops_undefined"):
        build_library(spec, tmp_path / "cache", nvcc_toolkit)
    key = spec.key_dir(tmp_path / "cache")
    assert not key.exists()
    assert [p.name for p in key.parent.iterdir()] == [f"{key.name}.lock"]


_CONCURRENT = """
import json, sys
from pathlib import Path
from kdactl.hw.toolkit import find_toolkit
from kdactl.jit.build import build_library
from kdactl.jit.spec import kernel_library_spec
from kdactl.targets import get_target
spec = kernel_library_spec(get_target("sm_90a"), Path(sys.argv[1]))
result = build_library(spec, Path(sys.argv[2]), find_toolkit())
print(json.dumps({"built": result.built, "dir": str(result.directory), "pid": __import__("os").getpid()}))
"""


def test_concurrent_builds_on_an_empty_cache_build_once(tmp_path, tiny_csrc, nvcc_toolkit):
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(tiny_csrc), str(tmp_path / "cache")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    results = [json.loads(out) for out, _ in outs]
    assert sum(r["built"] for r in results) == 1
    assert len({r["dir"] for r in results}) == 1
    manifest = json.loads((Path(results[0]["dir"]) / "manifest.json").read_text())
    assert manifest["builder"]["pid"] == next(r["pid"] for r in results if r["built"])


@pytest.mark.parametrize("level", ["entry folder", "library"])
def test_check_entry_refuses_an_entry_others_can_write(tmp_path, level):
    """Every level down to the .so: a private cache root does not make a writable entry safe."""
    _fake_entry(tmp_path / "e")
    writable = tmp_path / "e" if level == "entry folder" else tmp_path / "e" / "libkdactl.so"
    os.chmod(writable, writable.stat().st_mode | 0o002)
    with pytest.raises(UnsafeCache, match=f"{writable.name} is writable by group or other") as err:
        cache.check_entry(tmp_path / "e", "sm_90a", "abc")
    assert err.value.exit_code == EXIT_USAGE


# --- symlinks: judged where they lead ------------------------------------------------------------


def _shared_folder(path: Path, mode: int) -> Path:
    path.mkdir()
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_entry_symlinked_into_a_folder_others_can_write_is_refused(tmp_path, mode):
    """The entry itself is private, but others could swap it: its real folder is theirs to write."""
    shared = _shared_folder(tmp_path / "shared", mode)
    _fake_entry(shared / "e")
    (tmp_path / "cache").mkdir(mode=0o700)
    link = tmp_path / "cache" / "e"
    link.symlink_to(shared / "e")
    with pytest.raises(UnsafeCache, match="writable by group or other") as err:
        cache.check_entry(link, "sm_90a", "abc")
    assert f"{link} resolves to {shared / 'e'}" in str(err.value) and f"{shared} is writable" in str(err.value)
    assert err.value.exit_code == EXIT_USAGE and "\n" not in str(err.value)


def test_library_symlinked_into_a_folder_others_can_write_is_refused(tmp_path):
    _fake_entry(tmp_path / "e")
    drop = _shared_folder(tmp_path / "drop", 0o777)
    library = tmp_path / "e" / "libkdactl.so"
    library.rename(drop / "libkdactl.so")
    library.symlink_to(drop / "libkdactl.so")
    with pytest.raises(UnsafeCache, match=f"file {library} resolves to {drop / 'libkdactl.so'}.*{drop} is writable"):
        cache.check_entry(tmp_path / "e", "sm_90a", "abc")


def test_cache_dir_symlinked_to_a_writable_folder_names_both(tmp_path):
    real = _shared_folder(tmp_path / "open", 0o777)
    link = tmp_path / "kdactl"
    link.symlink_to(real)
    with pytest.raises(UnsafeCache, match=f"directory {link} resolves to {real}.*is writable by group or other"):
        cache.ensure_private_dirs(link)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_cache_dir_symlinked_into_another_users_folder_is_refused(tmp_path):
    theirs = _shared_folder(tmp_path / "theirs", 0o755)
    os.chown(theirs, 12345, 12345)
    real = theirs / "kdactl"
    real.mkdir(mode=0o700)  # ours, but in a folder whose owner can rename it away
    link = tmp_path / "kdactl"
    link.symlink_to(real)
    with pytest.raises(UnsafeCache, match=f"{theirs} is owned by uid 12345"):
        cache.ensure_private_dirs(link, link / "0.1.0")


def test_cache_dir_symlinked_into_a_sticky_scratch_folder_is_accepted(tmp_path):
    """/tmp-like (sticky, world-writable): nobody else can rename what we own in it."""
    scratch = _shared_folder(tmp_path / "scratch", 0o1777)
    real = scratch / "me"
    real.mkdir(mode=0o700)
    link = tmp_path / "kdactl"
    link.symlink_to(real)
    cache.ensure_private_dirs(link, link / "0.1.0" / "sm_90a")
    assert (real / "0.1.0" / "sm_90a").is_dir()


@pytest.mark.parametrize("mode, uid, shared, above, problem", [
    (0o700, 1000, False, False, ""),
    (0o755, 1000, False, False, ""),
    (0o775, 1000, False, False, "writable by group or other (mode 0o775)"),
    (0o1777, 1000, False, False, "writable by group or other (mode 0o1777)"),  # sticky: not for the cache itself
    (0o1777, 0, False, True, ""),  # /tmp above a symlink's target
    (0o777, 0, False, True, "writable by group or other (mode 0o777)"),
    (0o755, 0, False, False, "owned by uid 0, not this user (uid 1000)"),
    (0o755, 0, False, True, ""),  # root's folders above a target
    (0o755, 1001, False, True, "owned by uid 1001, not this user (uid 1000)"),
    (0o755, 1001, True, False, ""),  # an installed AOT bundle
    (0o775, 1001, True, True, "writable by group or other (mode 0o775)"),
])  # fmt: skip
def test_unsafe_mode_or_owner(mode, uid, shared, above, problem):
    found = cache.unsafe_mode_or_owner(mode, uid, 1000, shared=shared, above=above)
    assert (problem in found) if problem else found == ""


def test_lookup_refuses_a_group_writable_library_in_a_private_cache(tmp_path, tiny_csrc):
    spec = kernel_library_spec(get_target("sm_90a"), tiny_csrc)
    root = tmp_path / "cache"
    key = spec.key_dir(root, spec.source_hash())
    cache.ensure_private_dirs(root, key.parent)
    _fake_entry(key, source_hash=spec.source_hash())
    os.chmod(key, 0o700)
    assert lookup_cached(spec, root) is not None
    os.chmod(key / "libkdactl.so", 0o664)
    with pytest.raises(UnsafeCache, match="libkdactl.so is writable"):
        lookup_cached(spec, root)
