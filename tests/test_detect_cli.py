"""``kdactl detect`` end to end: typer's CliRunner with fake providers, and real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import kdactl.node
from kdactl.cli import app
from tests.fakes import B300, CPU_TORCH, H200, NO_DRIVER, FakeNvml, fleet, providers

runner = CliRunner()


@pytest.fixture
def node(monkeypatch):
    """Install fake providers for the CLI: node(p) makes detect read p."""

    def install(p):
        monkeypatch.setattr(kdactl.node, "real_providers", lambda settings: p)

    monkeypatch.delenv("KDACTL_CUDA_ARCH", raising=False)
    return install


def test_h200_json(node):
    node(providers([H200]))
    result = runner.invoke(app, ["detect", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "kdactl.detect/v1" and doc["exit_code"] == 0 and doc["error"] is None
    g = doc["gpus"][0]
    assert (g["sku"], g["cc"], g["sm_count"], g["target"]) == ("H200", "9.0", 132, "sm_90a")
    assert doc["node"]["target"] == "sm_90a" and doc["node"]["driver_version"] == "580.159.04"
    assert result.stderr == ""


def test_h200_table(node):
    node(providers(fleet(H200, 2)))
    result = runner.invoke(app, ["detect"])
    assert result.exit_code == 0
    for needle in ("H200", "sm_90a", "132", "580.159.04"):
        assert needle in result.stdout


def test_no_driver_json_is_one_document_and_exit_3(node):
    node(providers([], nvml=FakeNvml([], fail=NO_DRIVER), torch=CPU_TORCH))
    result = runner.invoke(app, ["detect", "--json"])
    assert result.exit_code == 3
    doc = json.loads(result.stdout)
    assert doc["gpus"] == [] and doc["error"].startswith("no NVIDIA driver") and doc["exit_code"] == 3
    assert doc["node"]["host_arch"] == "x86_64" and doc["node"]["torch"]["version"] == "2.13.0+cpu"


def test_no_driver_text_is_one_line_on_stderr(node):
    node(providers([], nvml=FakeNvml([], fail=NO_DRIVER), torch=CPU_TORCH))
    result = runner.invoke(app, ["detect"])
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kdactl: no NVIDIA driver") and "Traceback" not in result.output


def test_unsupported_target_exits_3(node):
    node(providers([B300], cuda_toolkit=(12, 8), nvml=FakeNvml([B300], cuda=12080)))
    result = runner.invoke(app, ["detect", "--json"])
    assert result.exit_code == 3 and "no kernel target" in json.loads(result.stdout)["error"]


def test_bad_override_is_usage_error(node, monkeypatch):
    node(providers([H200]))
    monkeypatch.setenv("KDACTL_CUDA_ARCH", "sm_91")
    result = runner.invoke(app, ["detect", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"command": "detect", "error": result.stderr.strip().removeprefix("kdactl: "),
                                          "exit_code": 2}


def test_override_from_environment(node, monkeypatch):
    node(providers([H200]))
    monkeypatch.setenv("KDACTL_CUDA_ARCH", "sm_90a")
    doc = json.loads(runner.invoke(app, ["detect", "--json"]).stdout)
    assert doc["node"]["cuda_arch_override"] == "sm_90a" and doc["gpus"][0]["target_reason"] == "KDACTL_CUDA_ARCH=sm_90a"


def test_crash_in_a_provider_is_exit_3_one_line(node):
    class Exploding:
        def read(self):
            raise ZeroDivisionError("boom")

    node(providers([H200], torch=Exploding()))
    result = runner.invoke(app, ["detect", "--json"])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["error"] == "internal error: ZeroDivisionError: boom"


def test_detect_help():
    result = runner.invoke(app, ["detect", "--help"])
    assert result.exit_code == 0 and "--json" in result.stdout and "kernel target" in result.stdout


def test_python_m_kdactl_help():
    proc = subprocess.run([sys.executable, "-m", "kdactl", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "detect" in proc.stdout


def test_real_detect_json_on_this_machine():
    """On a CPU machine: valid JSON and exit 3; on a GPU node: valid JSON, exit 0 or 3 with the reason."""
    proc = subprocess.run([sys.executable, "-m", "kdactl", "detect", "--json"], capture_output=True, text=True, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == doc["exit_code"] in (0, 3)
    assert "Traceback" not in proc.stderr
    if not doc["gpus"]:
        assert proc.returncode == 3 and doc["error"]


@pytest.mark.parametrize("args, command", [
    (["detect", "--json", "--no-such-option"], "detect"),
    (["fleet", "report", "--json", "--tolerance", "lots"], "fleet report"),
    (["bench", "--json", "--iters", "many"], "bench"),
])  # fmt: skip
def test_json_usage_error_from_the_parser_is_one_json_document(args, command):
    """Click's own usage errors (unknown option, a value of the wrong type) end as kdactl's do."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["command"] == command and doc["exit_code"] == 2 and doc["error"]
    assert result.stderr.strip().splitlines() == [f"kdactl: {doc['error']}"]
