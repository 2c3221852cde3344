import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kdactl.bench import runner
from kdactl.cli import app
from tests.bench_fakes import FakeHarness

cli = CliRunner()


@pytest.fixture
def fake(monkeypatch):
    h = FakeHarness()
    monkeypatch.setattr(runner, "_default_harness", lambda o: h)
    return h


def invoke(*args):
    return cli.invoke(app, ["bench", *args])


def test_help():
    r = invoke("--help")
    assert r.exit_code == 0
    for opt in ("--suite", "--shape", "--varlen", "--routes", "--peers", "--gate", "--record-baseline", "--plot"):
        assert opt in r.stdout


def test_pass_json_one_document(fake):
    r = invoke("--shape", "1,64,2", "--iters", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 0 and doc["shapes"][0]["shape"]["label"] == "B1-T64-H2-D128"


def test_table(fake):
    r = invoke("--varlen", "5,6", "--heads", "2", "--iters", "2")
    assert r.exit_code == 0, r.output
    assert "varlen(5,6)-H2-D128" in r.stdout and "bench: pass" in r.stdout


def test_wrong_kernel_exits_1(fake):
    fake.wrong.add("auto")
    r = invoke("--shape", "1,64,2", "--iters", "2", "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout)["reasons"]


def test_usage_error_exits_2(fake):
    r = invoke("--shape", "1,64", "--json")
    assert r.exit_code == 2
    assert "--shape" in json.loads(r.stdout)["error"]


def test_gate_regression_exits_1(fake, tmp_path):
    path = tmp_path / "H200.toml"
    assert invoke("--shape", "1,64,2", "--iters", "2", "--record-baseline", "--baseline", str(path)).exit_code == 0
    path.write_text(path.read_text().replace("median_ms = 1.0", "median_ms = 0.5"))
    r = invoke("--shape", "1,64,2", "--iters", "2", "--gate", "--baseline", str(path), "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout)["gate"]["rows"][0]["status"] == "regressed"


def test_no_gpu_exits_3_with_one_line():
    """The real harness on this CPU-only machine (the GPU CI skips this)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = invoke("--json")
    assert r.exit_code == 3
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 3 and "no CUDA GPU" in doc["error"]
    r = invoke()
    assert r.exit_code == 3
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no CUDA GPU" in lines[0]


def test_subprocess_no_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    p = subprocess.run([sys.executable, "-m", "kdactl", "bench", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3
    assert json.loads(p.stdout)["exit_code"] == 3
    assert p.stderr.strip().count("\n") == 0 and "no CUDA GPU" in p.stderr


def test_host_mode_through_the_cli(fake):
    fake.host_us = {"auto": 12.0, "direct": 11.0}
    r = invoke("--host", "--json", "--peers", "none")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    first = doc["shapes"][0]
    assert first["shape"]["label"] == "B1-T64-H4-D128" and first["candidates"][0]["host"]["eager_us"] == pytest.approx(12.0)
    r = invoke("--host", "--gate", "--json")
    assert r.exit_code == 2 and "--host" in json.loads(r.stdout)["error"]
