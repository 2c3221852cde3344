"""kdactl.suite: JUnit parsing over recorded pytest reports, and the run's judgement with a fake
runner (crash, timeout, empty run, all skipped). CPU only; one test runs the real checks/ here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kdactl.proc import ProcResult, run_process
from kdactl.suite import judge_run, parse_junit, run_suite, suite_command, suite_env

DATA = Path(__file__).parent / "data" / "junit"


def xml(name: str) -> str:
    return (DATA / name).read_text()


def by_status(results):
    return {r.check.split("::")[-1]: r.status for r in results}


def test_parse_mixed_report():
    results = parse_junit(xml("mixed.xml"), gpu=1)
    assert by_status(results) == {"test_ok": "pass", "test_bad": "fail", "test_err": "error", "test_skip": "skip"}
    fail = next(r for r in results if r.status == "fail")
    assert fail.check == "suite.test_mix::test_bad" and fail.gpu == 1
    assert "error ratio o=1.0e-01" in fail.message and "\n" not in fail.message
    error = next(r for r in results if r.status == "error")
    assert "library failed to load" in error.message
    skip = next(r for r in results if r.status == "skip")
    assert skip.message == "route chunk not eligible: K must be 128" and not skip.required


def test_judge_mixed_run_adds_nothing():
    results = judge_run(ProcResult(1, "1 failed", 2.0), xml("mixed.xml"), 0)
    assert len(results) == 4


def test_all_skipped_is_an_error():
    results = judge_run(ProcResult(0, "35 skipped", 2.0), xml("checks_no_gpu.xml"), 0)
    assert sum(r.status == "skip" for r in results) == 35
    whole = [r for r in results if r.check == "suite"]
    assert len(whole) == 1 and whole[0].status == "error" and "no CUDA GPU" in whole[0].message


def test_empty_run_is_an_error():
    (result,) = judge_run(ProcResult(5, "no tests ran", 1.0), xml("empty.xml"), 0)
    assert result.status == "error" and "ran no checks" in result.message


@pytest.mark.parametrize(
    "proc,text,words",
    [
        (ProcResult(None, "tests/test_graphs.py ..", 120.0, timed_out=True), None, "timed out after 120 s"),
        (ProcResult(-6, "Fatal Python error: Aborted", 3.0), None, "killed by signal 6"),
        (ProcResult(0, "", 3.0), "<testsuites><testsu", "cannot read the suite's JUnit report"),
        (ProcResult(0, "", 3.0), "<html/>", "cannot read"),
        (ProcResult(None, "", 0.0, start_error="cannot run python: No such file"), None, "cannot start"),
    ],
    ids=["timeout", "crash", "truncated-xml", "not-junit", "no-python"],
)
def test_broken_runs_are_one_error(proc, text, words):
    (result,) = judge_run(proc, text, 0, timeout_s=120)
    assert result.status == "error" and result.check == "suite" and words in result.message


def test_pytest_internal_error_with_passes_is_an_error():
    results = judge_run(ProcResult(3, "INTERNALERROR", 1.0), xml("mixed.xml").replace("failure", "x"), 0)
    assert results[-1].check == "suite" and results[-1].status == "error"


def test_failed_exit_without_failures_is_an_error():
    text = '<testsuites><testsuite><testcase classname="test_a" name="test_x" time="0.1"/></testsuite></testsuites>'
    results = judge_run(ProcResult(1, "", 1.0), text, 0)
    assert [r.status for r in results] == ["pass", "error"]


def test_command_and_env(tmp_path):
    cmd = suite_command(tmp_path, tmp_path / "j.xml", quick=True)
    assert cmd[:3] == [sys.executable, "-m", "pytest"] and "-p" in cmd and "no:cacheprovider" in cmd
    assert f"--junitxml={tmp_path / 'j.xml'}" in cmd and cmd[-2:] == ["-m", "quick"]
    env = suite_env("3", {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin" and env["PYTHONPATH"]


def test_run_suite_with_fake_runner(tmp_path):
    seen = {}

    def runner(cmd, *, env, timeout_s, cwd=None):
        seen.update(cmd=cmd, env=env, timeout_s=timeout_s)
        junit = next(a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml="))
        Path(junit).write_text(xml("mixed.xml"))
        return ProcResult(1, "", 1.5)

    results = run_suite(2, quick=True, timeout_s=30, checks_dir=tmp_path, env={}, runner=runner)
    assert len(results) == 4 and seen["timeout_s"] == 30 and seen["env"]["CUDA_VISIBLE_DEVICES"] == "2"
    # certify's worker hands down its GPU's UUID: the child sees that GPU, not the index re-masked
    run_suite(2, checks_dir=tmp_path, env={}, runner=runner, visible="GPU-fa9f48df")
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-fa9f48df" and {r.gpu for r in results} == {2}


def test_run_process_kills_on_timeout():
    proc = run_process([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                       env={"PATH": "/usr/bin:/bin"}, timeout_s=1.0)  # fmt: skip
    assert proc.timed_out and proc.returncode is None and "started" in proc.output and proc.duration_s < 30


def test_run_process_reports_a_crash_and_a_missing_program():
    crash = run_process([sys.executable, "-c", "import os; os.abort()"], env={}, timeout_s=30)
    assert crash.returncode == -6 and not crash.timed_out
    missing = run_process(["/nonexistent/kdactl-python"], env={}, timeout_s=5)
    assert missing.start_error and missing.returncode is None


def test_real_checks_on_this_machine_never_pass():
    """The real suite in a subprocess: with a GPU it runs; on a CPU machine every check skips and
    the run is one inconclusive error."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the suite really runs (see the GPU run)")
    results = run_suite(0, quick=True, timeout_s=120)
    assert any(r.check == "suite" and r.status == "error" and "no CUDA GPU" in r.message for r in results)
    assert not any(r.status == "pass" for r in results)
