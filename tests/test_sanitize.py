"""kdactl.sanitizer.run orchestration with a fake process runner over recorded compute-sanitizer output
(CPU only): positive control first, payload second, verdict per tool, Report and CLI exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kdactl.sanitizer.run as sanitize_mod
from kdactl.cli import app
from kdactl.errors import NoGpu, ToolMissing, UsageError
from kdactl.proc import ProcResult
from kdactl.sanitizer.run import (
    ERROR_EXITCODE, Prepared, SanitizeReport, ToolRun, parse_tools, run_sanitizers, sanitize_command,
    sanitize_tools, sanitizer_command, sanitizer_env,
)  # fmt: skip
from kdactl.sanitizer import TOOLS
from kdactl.settings import Settings

DATA = Path(__file__).parent / "data" / "sanitizer"
CAUGHT = {"memcheck": ("memcheck_oob", 99), "synccheck": ("synccheck_barrier", 99),
          "racecheck": ("racecheck_race", 99), "initcheck": ("initcheck_uninit", 99)}  # fmt: skip
FAULT = {"memcheck": "oob", "synccheck": "barrier", "racecheck": "race", "initcheck": "uninit"}
OK_LINE = "KDACTL-PAYLOAD-OK routes=direct kernels=9"


def recorded(name: str) -> str:
    return (DATA / f"{name}.txt").read_text()


def clean(tool: str, extra: str = "") -> str:
    """The tool's recorded clean output with the payload's own lines in place of the old sentinel."""
    return recorded(f"{tool}_clean").replace("KDACTL_SANITIZER_SENTINEL kernels_ran=1", extra)


def caught(tool: str) -> ProcResult:
    name, rc = CAUGHT[tool]
    return ProcResult(rc, f"KDACTL-CONTROL-RAN fault={FAULT[tool]} launched=1 rc=719\n" + recorded(name), 0.5)


class FakeRunner:
    """Answers control and payload runs per tool from a table; records every command."""

    def __init__(self, control=None, payload=None):
        self.control = control or caught
        self.payload = payload or (lambda tool: ProcResult(0, clean(tool, OK_LINE), 2.0))
        self.calls: list[tuple[str, str, float]] = []

    def __call__(self, cmd, *, env, timeout_s, cwd=None):
        tool = cmd[cmd.index("--tool") + 1]
        kind = "control" if cmd[-4:][0] == "--lib" or "control.py" in " ".join(cmd) else "payload"
        self.calls.append((tool, kind, timeout_s))
        assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
        return self.control(tool) if kind == "control" else self.payload(tool)


def run(runner, tools=TOOLS, prepare=None, find=None, timeout_s=60.0):
    return sanitize_tools(
        Settings.from_env({}), tools=tools, gpu=0, timeout_s=timeout_s, runner=runner,
        prepare=prepare or (lambda s: Prepared("sm_90a", Path("/cache/libkdactl_faults.so"))),
        find=find or (lambda s: "/usr/local/cuda/bin/compute-sanitizer"), checks_dir=Path("/checks"),
    )  # fmt: skip


def test_all_tools_pass_with_control_and_payload():
    runner = FakeRunner()
    runs = run(runner)
    assert [r.status for r in runs] == ["pass"] * 4
    for tool in TOOLS:  # the tools run at once, and each tool's control and payload at once
        assert sorted(c[1] for c in runner.calls if c[0] == tool) == ["control", "payload"]
    assert "routes=direct kernels=9" in runs[0].message and "control oob: caught (67 errors)" in runs[0].message
    assert runs[0].details["payload"]["kernels"] == 9 and runs[0].details["control"]["caught"]
    report = SanitizeReport(0, tuple(runs))
    assert report.exit_code == 0 and report.to_json()["verdict"] == "certified"


def test_control_not_caught_is_not_trusted_and_payload_not_judged():
    runner = FakeRunner(control=lambda tool: ProcResult(0, f"KDACTL-CONTROL-RAN fault={FAULT[tool]} launched=1 rc=0\n"
                                                          + clean(tool), 0.3))  # fmt: skip
    runs = run(runner, tools=("synccheck",))
    assert runs[0].status == "error" and "sanitizer not trusted" in runs[0].message
    assert runs[0].details["payload"] is None  # a clean payload under an untrusted tool proves nothing
    assert SanitizeReport(0, tuple(runs)).exit_code == 3


def test_control_that_never_launched_is_not_caught():
    runner = FakeRunner(control=lambda tool: ProcResult(99, recorded(CAUGHT[tool][0]), 0.3))
    (result,) = run(runner, tools=("memcheck",))
    assert result.status == "error" and "did not launch" in result.message


def test_control_timeout_is_not_caught():
    runner = FakeRunner(control=lambda tool: ProcResult(None, "", 120.0, timed_out=True))
    (result,) = run(runner, tools=("racecheck",))
    assert result.status == "error" and "timed out" in result.message


@pytest.mark.parametrize(
    "payload,status,words",
    [
        (ProcResult(0, clean("memcheck"), 2.0), "error", "sentinel is missing"),
        (ProcResult(None, "====== COMPUTE-SANITIZER\n", 60.0, timed_out=True), "error", "killed after the 60 s"),
        (ProcResult(137, recorded("memcheck_killed"), 9.0), "error", "run killed"),
        (ProcResult(ERROR_EXITCODE, recorded("memcheck_oob"), 2.0), "fail", "memcheck: 67 errors"),
        (ProcResult(1, clean("memcheck", "KDACTL-PAYLOAD-FAIL decode_like fixed: route direct: error ratio o=1e-01"), 2.0),
         "fail", "payload result wrong"),
        (ProcResult(1, recorded("memcheck_appfail") + OK_LINE + "\n", 2.0), "error", "application failed although"),
        (ProcResult(3, clean("memcheck", "KDACTL-PAYLOAD-ERROR BuildError: cannot load"), 2.0), "error",
         "payload: BuildError"),
        (ProcResult(None, "", 0.0, start_error="cannot run /x: No such file"), "error", "cannot run the payload"),
    ],
    ids=["no-sentinel", "timeout", "killed", "errors", "wrong-result", "appfail-0-errors", "payload-error", "no-start"],
)
def test_payload_verdicts(payload, status, words):
    (result,) = run(FakeRunner(payload=lambda tool: payload), tools=("memcheck",))
    assert result.status == status and words in result.message, result.message


def test_tool_missing_makes_every_tool_an_error():
    def find(settings):
        raise ToolMissing("compute-sanitizer not found")

    runner = FakeRunner()
    runs = run(runner, find=find)
    assert [r.status for r in runs] == ["error"] * 4 and "compute-sanitizer not found" in runs[0].message
    assert runner.calls == []


def test_no_gpu_is_an_error_with_the_reason():
    def prepare(settings):
        raise NoGpu("no CUDA device visible to torch")

    results = run_sanitizers(Settings.from_env({}), tools=("memcheck",), runner=FakeRunner(), prepare=prepare,
                             find=lambda s: "cs", checks_dir=Path("/checks"))  # fmt: skip
    assert results[0].status == "error" and results[0].check == "sanitize.memcheck" and "no CUDA device" in results[0].message


def test_command_line_of_a_run():
    cmd = sanitizer_command("/cs", "racecheck", Path("/checks/payload.py"), ["--faults-lib", "/f.so"])
    assert cmd[:7] == ["/cs", "--tool", "racecheck", "--error-exitcode", "99", "--target-processes", "all"]
    assert cmd[-3:] == ["/checks/payload.py", "--faults-lib", "/f.so"]
    env = sanitizer_env("2", {})
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


def test_parse_tools():
    assert parse_tools(None) == TOOLS
    assert parse_tools("racecheck, memcheck,racecheck") == ("racecheck", "memcheck")
    with pytest.raises(Exception, match="--tool takes"):
        parse_tools("memchek")


# --- CLI ---------------------------------------------------------------------------------------

def fake_runs(*statuses):
    def fake(settings, *, tools, gpu, timeout_s, **kw):
        return [ToolRun(t, s, f"{t}: {s}", 1.0) for t, s in zip(tools, statuses)]
    return fake


@pytest.mark.parametrize("statuses,code", [(("pass",) * 4, 0), (("pass", "fail", "pass", "error"), 1),
                                           (("pass", "error", "pass", "pass"), 3)])  # fmt: skip
def test_cli_exit_codes_and_one_json_document(monkeypatch, statuses, code):
    monkeypatch.setattr(sanitize_mod, "sanitize_tools", fake_runs(*statuses))
    result = CliRunner().invoke(app, ["sanitize", "--json", "--gpu", "1"])
    assert result.exit_code == code
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == code and doc["gpu"] == 1 and len(doc["results"]) == 4


def test_cli_text_and_tool_option(monkeypatch):
    monkeypatch.setattr(sanitize_mod, "sanitize_tools", fake_runs("pass"))
    result = CliRunner().invoke(app, ["sanitize", "--tool", "initcheck"])
    assert result.exit_code == 0 and "initcheck" in result.stdout and "certified" in result.stdout


@pytest.mark.parametrize("args", [["--tool", "memchek"], ["--timeout", "0"], ["--gpu", "-1"]])
def test_cli_usage_errors_exit_2(args):
    result = CliRunner().invoke(app, ["sanitize", "--json", *args])
    assert result.exit_code == 2 and "error" in json.loads(result.stdout)


def test_cli_help():
    result = CliRunner().invoke(app, ["sanitize", "--help"])
    assert result.exit_code == 0 and "--tool" in result.stdout and "planted fault" in result.stdout


def test_sanitize_command_report_on_a_machine_without_the_tool(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    report = sanitize_command(Settings.from_env({"PATH": "/nonexistent", "KDACTL_NVCC": "/nonexistent/nvcc"}),
                              tools="memcheck")  # fmt: skip
    assert report.exit_code == 3 and "not run" in report.runs[0].message  # no sanitizer here, or no GPU


def test_unknown_fault_is_a_usage_error_before_any_run():
    with pytest.raises(UsageError, match="KDACTL_FAULT='sanitiser'"):
        sanitize_command(Settings.from_env({"KDACTL_FAULT": "sanitiser"}), tools="memcheck")
