"""kdactl.suite and its pytest plugin: a real pytest run of a small mixed module through the plugin,
and the run's judgement with a fake runner (crash, timeout, empty run, all skipped). CPU only; one
test runs the real checks/ here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdactl.proc import ProcResult, run_process
from kdactl.results import CheckResult
from kdactl.suite import judge_run, parse_results, run_suite, suite_command, suite_env
from kdactl.suite_plugin import check_name

MIXED = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("library failed to load")

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("stream left busy")

def test_ok():
    pass

def test_bad():
    assert 1 == 2, "error ratio o=1.0e-01 state=2.0e-03"

def test_err(broken):
    pass

def test_skip():
    pytest.skip("route chunk not eligible: K must be 128")

def test_fail_then_teardown_error(bad_teardown):
    assert False, "wrong result"

def test_teardown_error(bad_teardown):
    pass
"""


def plugin_run(root: Path, module: str) -> tuple[subprocess.CompletedProcess, str]:
    """A real pytest run of one module with the plugin."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "test_mod.py").write_text(module)
    out = root / "results.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, "-m", "pytest", str(root), "-q", "-p", "no:cacheprovider", "-p",
                           "kdactl.suite_plugin", f"--kdactl-results={out}", f"--rootdir={root}"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    return proc, out.read_text()


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    return plugin_run(tmp_path_factory.mktemp("suite"), MIXED)


def by_status(results):
    return {r.check.split("::")[-1]: r.status for r in results}


def results_text(*results: CheckResult) -> str:
    return json.dumps({"results": [r.to_json() for r in results]})


MIXED_RESULTS = results_text(CheckResult("suite.test_mix::test_ok", "pass"), CheckResult("suite.test_mix::test_bad", "fail", "x"),
                             CheckResult("suite.test_mix::test_err", "error", "y"),
                             CheckResult("suite.test_mix::test_skip", "skip", "z", required=False))  # fmt: skip


def test_plugin_reports_every_outcome(mixed_run):
    proc, text = mixed_run
    results = parse_results(text, gpu=1)
    assert by_status(results) == {"test_ok": "pass", "test_bad": "fail", "test_err": "error", "test_skip": "skip",
                                  "test_fail_then_teardown_error": "fail", "test_teardown_error": "error"}, proc.stdout  # fmt: skip
    fail = next(r for r in results if r.check.endswith("::test_bad"))
    assert fail.check == "suite.test_mod::test_bad" and fail.gpu == 1
    assert "error ratio o=1.0e-01" in fail.message and "\n" not in fail.message
    error = next(r for r in results if r.check.endswith("::test_err"))
    assert "library failed to load" in error.message
    skip = next(r for r in results if r.status == "skip")
    assert skip.message == "route chunk not eligible: K must be 128" and not skip.required
    assert "stream left busy" in next(r for r in results if r.check.endswith("::test_teardown_error")).message


def test_plugin_reports_a_module_that_cannot_be_collected(tmp_path):
    proc, text = plugin_run(tmp_path, "import no_such_module_kdactl\n")
    (r,) = parse_results(text)
    assert r.check == "suite.test_mod" and r.status == "error" and proc.returncode == 2
    assert r.message == "collection failure: ModuleNotFoundError: No module named 'no_such_module_kdactl'"


def test_check_names():
    assert check_name("checks/test_routes.py::test_x[direct-B1]") == "suite.test_routes::test_x[direct-B1]"
    assert check_name("test_routes.py::TestX::test_y") == "suite.test_routes.TestX::test_y"
    assert check_name("checks/test_broken.py") == "suite.test_broken"


def test_judge_mixed_run_adds_nothing():
    results = judge_run(ProcResult(1, "1 failed", 2.0), MIXED_RESULTS, 0)
    assert len(results) == 4


def test_all_skipped_is_an_error():
    skips = [CheckResult(f"suite.test_routes::test_{i}", "skip", "no CUDA GPU", required=False) for i in range(35)]
    results = judge_run(ProcResult(0, "35 skipped", 2.0), results_text(*skips), 0)
    assert sum(r.status == "skip" for r in results) == 35
    whole = [r for r in results if r.check == "suite"]
    assert len(whole) == 1 and whole[0].status == "error" and "no CUDA GPU" in whole[0].message


def test_empty_run_is_an_error():
    (result,) = judge_run(ProcResult(5, "no tests ran", 1.0), results_text(), 0)
    assert result.status == "error" and "ran no checks" in result.message


@pytest.mark.parametrize(
    "proc,text,words",
    [
        (ProcResult(None, "tests/test_graphs.py ..", 120.0, timed_out=True), None, "timed out after 120 s"),
        (ProcResult(-6, "Fatal Python error: Aborted", 3.0), None, "killed by signal 6"),
        (ProcResult(0, "", 3.0), '{"results": [{"check": "a", "sta', "cannot read the suite's results file"),
        (ProcResult(0, "", 3.0), "<html/>", "cannot read"),
        (ProcResult(0, "", 3.0), '{"results": [{"check": "a", "status": "great"}]}', "cannot read"),
        (ProcResult(None, "", 0.0, start_error="cannot run python: No such file"), None, "cannot start"),
    ],
    ids=["timeout", "crash", "truncated", "not-json", "bad-status", "no-python"],
)
def test_broken_runs_are_one_error(proc, text, words):
    (result,) = judge_run(proc, text, 0, timeout_s=120)
    assert result.status == "error" and result.check == "suite" and words in result.message


def test_pytest_internal_error_with_passes_is_an_error():
    results = judge_run(ProcResult(3, "INTERNALERROR", 1.0), results_text(CheckResult("suite.t::a", "pass")), 0)
    assert results[-1].check == "suite" and results[-1].status == "error"


def test_failed_exit_without_failures_is_an_error():
    results = judge_run(ProcResult(1, "", 1.0), results_text(CheckResult("suite.test_a::test_x", "pass")), 0)
    assert [r.status for r in results] == ["pass", "error"]


def test_command_and_env(tmp_path):
    cmd = suite_command(tmp_path, tmp_path / "r.json", quick=True)
    assert cmd[:3] == [sys.executable, "-m", "pytest"] and "-p" in cmd and "no:cacheprovider" in cmd
    assert "kdactl.suite_plugin" in cmd and f"--kdactl-results={tmp_path / 'r.json'}" in cmd and cmd[-2:] == ["-m", "quick"]
    env = suite_env("3", {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin" and env["PYTHONPATH"]


def test_run_suite_with_fake_runner(tmp_path):
    seen = {}

    def runner(cmd, *, env, timeout_s, cwd=None):
        seen.update(cmd=cmd, env=env, timeout_s=timeout_s)
        report = next(a.split("=", 1)[1] for a in cmd if a.startswith("--kdactl-results="))
        Path(report).write_text(MIXED_RESULTS)
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


def test_run_process_terms_then_kills_and_can_log_to_a_file(tmp_path):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('got TERM', flush=True))\n"
            "print('started', flush=True)\n"
            "while True: time.sleep(0.1)\n")  # ignores TERM: only the KILL after the grace ends it
    log = tmp_path / "child.log"
    proc = run_process([sys.executable, "-c", code], env={}, timeout_s=1.0, log=log)
    assert proc.timed_out and proc.returncode is None
    assert "started" in log.read_text() and "got TERM" in log.read_text() and "got TERM" in proc.output


def test_cancel_waits_one_grace_period_for_all_children_not_one_each():
    """Children that ignore SIGTERM are killed after one shared grace, and nothing starts after."""
    import threading
    import time

    from kdactl.proc import INTERRUPTED, Children

    children, done = Children(), []
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    threads = [threading.Thread(target=lambda: done.append(run_process([sys.executable, "-c", stubborn], env=dict(os.environ),
                                                                       timeout_s=60, children=children)))
               for _ in range(3)]  # fmt: skip
    for t in threads:
        t.start()
    while len(children._live) < 3:
        time.sleep(0.05)
    time.sleep(0.5)  # each child has installed its handler
    start = time.monotonic()
    children.cancel(grace_s=1.0)
    for t in threads:
        t.join(10)
    assert time.monotonic() - start < 2.5, "the grace was waited once per child"
    assert len(done) == 3 and all(r.returncode is not None and r.returncode < 0 for r in done)
    late = run_process([sys.executable, "-c", "pass"], env=dict(os.environ), timeout_s=10, children=children)
    assert late.start_error == INTERRUPTED
