"""``kdactl build`` end to end (typer's CliRunner) and build_command with fake providers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kdactl.cli import app
from kdactl.errors import Inconclusive, NoGpu, UnsupportedTarget
from kdactl.build_command import build_command
from kdactl.jit.library import Kernels
from kdactl.jit.selftest import SelftestResult
from kdactl.jit.spec import kernel_library_spec
from kdactl.settings import Settings
from kdactl.targets import get_target
from tests.fakes import process_running, write_fake_nvcc

runner = CliRunner()


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the CLI tests that compile the real csrc, so each target compiles once."""
    return tmp_path_factory.mktemp("cli-cache") / "kdactl"


@pytest.fixture
def env(monkeypatch, shared_cache):
    monkeypatch.setenv("KDACTL_CACHE_DIR", str(shared_cache))
    for var in ("KDACTL_AOT_DIR", "KDACTL_CUDA_ARCH", "KDACTL_NVCC"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# --- through the CLI ------------------------------------------------------------------------------


def test_build_help_names_the_options():
    result = runner.invoke(app, ["build", "--help"])
    assert result.exit_code == 0
    for option in ("--target", "--aot", "--json"):
        assert option in result.stdout


def test_compile_two_targets_json(env, nvcc_toolkit, shared_cache):
    result = runner.invoke(app, ["build", "--target", "sm_90a,sm_100f", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["mode"] == "compile" and doc["passed"] is True and doc["exit_code"] == 0
    assert [lib["target"] for lib in doc["libraries"]] == ["sm_90a", "sm_100f"]
    for lib in doc["libraries"]:
        path = Path(lib["path"])
        assert path.is_file() and shared_cache in path.parents
        assert lib["manifest"]["target"] == lib["target"] and lib["load_s"] is None
    again = runner.invoke(app, ["build", "--target", "sm_90a,sm_100f"])
    assert again.exit_code == 0 and again.stdout.count("from cache") == 2


def test_aot_bundle_through_the_cli(env, nvcc_toolkit, tmp_path):
    result = runner.invoke(app, ["build", "--target", "sm_90a", "--aot", str(tmp_path / "aot"), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    index = json.loads((tmp_path / "aot" / "manifest.json").read_text())
    assert doc["aot_manifest"] == str(tmp_path / "aot" / "manifest.json")
    assert index["entries"]["sm_90a"]["path"] == "sm_90a/libkdactl.so"
    assert (tmp_path / "aot" / "sm_90a" / "libkdactl.so").is_file()


@pytest.mark.parametrize("targets", ["sm_91", "sm_90a,sm_91", ",", "sm_90"])
def test_unknown_target_exits_2(env, targets):
    result = runner.invoke(app, ["build", "--target", targets, "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit_code"] == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("kdactl: ")


def test_missing_nvcc_exits_3(env):
    env.setenv("KDACTL_NVCC", "/nonexistent/nvcc")
    result = runner.invoke(app, ["build", "--target", "sm_90a"])
    assert result.exit_code == 3
    assert "nvcc not found" in result.stderr and "Traceback" not in result.stderr


def test_unsafe_cache_with_real_nvcc_exits_2(env, nvcc_toolkit, tmp_path):
    unsafe = tmp_path / "shared"
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    env.setenv("KDACTL_CACHE_DIR", str(unsafe))
    result = runner.invoke(app, ["build", "--target", "sm_90a", "--json"])
    assert result.exit_code == 2
    assert "writable by group or other" in json.loads(result.stdout)["error"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_build_without_a_gpu_is_inconclusive(env):
    result = runner.invoke(app, ["build", "--json"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["exit_code"] == 3
    assert "Traceback" not in result.stderr


# --- build_command with fakes -----------------------------------------------------------------------


def _gpu(index, target="sm_90a", reason="cc 9.0 + CUDA 13.0"):
    return SimpleNamespace(index=index, name="NVIDIA H200", cc=(9, 0), target=target, target_reason=reason)


def _node(*gpus):
    def provider(settings):
        def require_gpus():
            if not gpus:
                raise NoGpu("no NVIDIA GPU found")
            return gpus

        return SimpleNamespace(gpus=gpus, require_gpus=require_gpus)

    return provider


def _loader(calls):
    def load(settings, target, toolkit_provider, csrc, progress):
        calls.append(target)
        return Kernels(None, Path(f"/cache/{target}/libkdactl.so"), target, "cache", {"target": target}, 0.0, 0.004)

    return load


def _selftest(mismatches=0):
    return lambda kernels, device: SelftestResult(device, 100, 1, mismatches, None if not mismatches else {"index": 3}, 0.01)


def _run(tmp_path, node, mismatches=0, devices=(0, 1), **settings):
    calls = []
    report = build_command(
        Settings(cache_dir=tmp_path / "c", data_dir=tmp_path / "d", **settings),
        node_provider=node,
        loader=_loader(calls),
        selftest=_selftest(mismatches),
        devices=lambda: list(devices),
    )
    return report, calls


def test_node_build_loads_the_node_target_and_selftests_every_gpu(tmp_path):
    report, calls = _run(tmp_path, _node(_gpu(0), _gpu(1)))
    assert calls == ["sm_90a"] and report.exit_code == 0
    doc = report.to_json()
    json.dumps(doc)
    assert doc["mode"] == "node" and [t["device"] for t in doc["selftests"]] == [0, 1]
    assert doc["libraries"][0]["from_cache"] is True and doc["libraries"][0]["load_s"] == 0.004


def test_selftest_mismatch_is_not_certified(tmp_path):
    report, _ = _run(tmp_path, _node(_gpu(0)), mismatches=5)
    assert report.exit_code == 1 and report.to_json()["passed"] is False


def test_no_visible_device_is_inconclusive(tmp_path):
    with pytest.raises(NoGpu, match="torch sees no CUDA device"):
        _run(tmp_path, _node(_gpu(0)), devices=())


def test_no_gpu_is_inconclusive(tmp_path):
    with pytest.raises(NoGpu):
        _run(tmp_path, _node())


def test_gpu_without_a_target_says_why(tmp_path):
    with pytest.raises(UnsupportedTarget, match="GPU 0 .*cc 9.0.*toolkit too old"):
        _run(tmp_path, _node(_gpu(0, None, "toolkit too old")))


def test_mixed_node_is_inconclusive(tmp_path):
    with pytest.raises(Inconclusive, match="different kernel targets"):
        _run(tmp_path, _node(_gpu(0), _gpu(1, "sm_100f")))


def test_cuda_arch_override_skips_detection(tmp_path):
    def boom(settings):
        raise AssertionError("detection must not run")

    report, calls = _run(tmp_path, boom, cuda_arch="sm_100f")
    assert calls == ["sm_100f"] and report.exit_code == 0


def test_report_renders(tmp_path):
    from rich.console import Console

    report, _ = _run(tmp_path, _node(_gpu(0)), mismatches=2)
    console = Console(record=True, width=200)
    report.render(console)
    text = console.export_text()
    assert "sm_90a: /cache/sm_90a/libkdactl.so (from cache" in text and "FAIL: 2 of 100" in text


# --- progress and interruption, with a fake nvcc ------------------------------------------------------


def _fake_build_env(env, tmp_path, **fake):
    env.setenv("KDACTL_NVCC", str(write_fake_nvcc(tmp_path, **fake)))
    env.setenv("KDACTL_CACHE_DIR", str(tmp_path / "cache"))
    return len(kernel_library_spec(get_target("sm_90a")).sources) + 1  # ninja edges: one per .cu, one link


def test_compile_reports_ninja_progress_on_stderr(env, tmp_path):
    """Not a terminal and no --json (a log file): one stderr line per ninja edge done, from ninja's own count."""
    edges = _fake_build_env(env, tmp_path)
    result = runner.invoke(app, ["build", "--target", "sm_90a"])
    assert result.exit_code == 0, result.stderr
    steps = [ln for ln in result.stderr.splitlines() if ln.startswith("kdactl build: sm_90a [")]
    assert [ln.split("[")[1].split("]")[0] for ln in steps] == [f"{i}/{edges}" for i in range(1, edges + 1)]
    assert "LINK libkdactl.so" in steps[-1] and steps[-1].endswith(" s)")
    assert "sm_90a: " in result.stdout and "built in" in result.stdout


def test_compile_json_prints_one_document_and_no_progress(env, tmp_path):
    _fake_build_env(env, tmp_path)
    result = runner.invoke(app, ["build", "--target", "sm_90a", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["libraries"][0]["origin"] == "built"
    assert result.stderr == ""  # stderr is not a terminal here: no progress either


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("sig, stubborn", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-compiler-ignores-TERM"])  # fmt: skip
def test_signal_to_kdactl_alone_ends_its_compilers(tmp_path, sig, stubborn):
    """The signal goes to the kdactl process only, as a supervisor's kill does, not to its group:
    the compilers end with it, no cache entry is left, and the exit is the CLI's interrupted 3."""
    pids = tmp_path / "nvcc.pids"
    cache_dir = tmp_path / "cache"
    nvcc = write_fake_nvcc(tmp_path, hang=True, pid_file=pids, ignore_term=stubborn)
    env = {k: v for k, v in os.environ.items() if k not in ("KDACTL_AOT_DIR", "KDACTL_CUDA_ARCH")}
    env.update(KDACTL_NVCC=str(nvcc), KDACTL_CACHE_DIR=str(cache_dir))
    kdactl = subprocess.Popen([sys.executable, "-m", "kdactl", "build", "--target", "sm_90a", "--json"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    compilers: list[int] = []
    try:
        assert _wait_for(lambda: pids.exists() and pids.read_text().strip(), 120), "the fake nvcc never started"
        kdactl.send_signal(sig)
        out, err = kdactl.communicate(timeout=30)
        compilers = [int(p) for p in pids.read_text().split()]
        assert _wait_for(lambda: not any(process_running(p) for p in compilers), 5), f"still running: {compilers}"
    finally:
        if kdactl.poll() is None:
            kdactl.kill()
        for pid in [int(p) for p in pids.read_text().split()] if pids.exists() else []:
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)
    assert kdactl.returncode == 3, err
    assert json.loads(out) == {"command": "build", "exit_code": 3, "error": "interrupted"}
    key = kernel_library_spec(get_target("sm_90a")).key_dir(cache_dir)
    assert [p.name for p in key.parent.iterdir()] == [f"{key.name}.lock"]  # no entry, no half-built temp folder
