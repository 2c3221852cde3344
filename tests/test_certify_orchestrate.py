"""Orchestration: node-level checks, per-GPU stages in parallel, time limits and crashes, with fake
stages (in process) and with real worker processes running fake stage functions."""

import os
import time

import pytest

from kdactl.certify import orchestrate as orch
from kdactl.certify.stages import Plan, StageSpec, default_plan, visible_devices_env
from kdactl.errors import UsageError
from kdactl.results import CheckResult, verdict
from tests import certify_fakes as cf


def jobs(n, env=None, quick=False):
    return [orch.GpuJob(i, cf.uuid(i), "sm_90a", "H200", quick, env or {}) for i in range(n)]


def test_eight_gpus_all_pass_certifies():
    runner = cf.FakeRunner()
    results = orch.run_gpus(jobs(8), default_plan(False), runner)
    assert {(r.check, r.gpu) for r in results} == {(s, i) for s in ("build", "suite", "sanitize", "perf") for i in range(8)}
    assert verdict(results)[0] == "certified"
    assert len(runner.calls) == 32


def test_one_failing_gpu_fails_the_node():
    runner = cf.FakeRunner({("suite", 5): lambda j: [CheckResult("route_smoke[direct]", "fail", "error ratio 0.2 > 5e-3")]})
    results = orch.run_gpus(jobs(8), default_plan(False), runner)
    name, reason = verdict(results)
    assert name == "not_certified" and "gpu5:route_smoke[direct]" in reason
    others = [r for r in results if r.gpu != 5]
    assert all(r.status == "pass" for r in others)


def test_build_failure_skips_later_stages_as_required():
    runner = cf.FakeRunner({("build", 2): lambda j: [CheckResult("build", "error", "nvcc failed")]})
    results = orch.run_gpus(jobs(3), default_plan(False), runner)
    gpu2 = [r for r in results if r.gpu == 2]
    assert [r.status for r in gpu2] == ["error", "skip", "skip", "skip"]
    assert all(r.required and "build did not pass" in r.message for r in gpu2[1:])
    assert ("suite", 2) not in runner.calls
    assert verdict(results)[0] == "inconclusive"


def test_empty_or_raising_stage_is_error_not_pass():
    def boom(job):
        raise OSError("fork failed")

    runner = cf.FakeRunner({("suite", 0): lambda j: [], ("perf", 0): boom})
    results = orch.run_gpus(jobs(1), default_plan(False), runner)
    by = {r.check: r for r in results}
    assert by["suite"].status == "error" and "no evidence" in by["suite"].message
    assert by["perf"].status == "error" and "fork failed" in by["perf"].message
    assert verdict(results)[0] == "inconclusive"


def test_quick_plan_reports_perf_as_optional_skip():
    plan = default_plan(True)
    assert [s.name for s in plan.stages] == ["build", "suite", "sanitize"]
    results = orch.run_gpus(jobs(2), plan, cf.FakeRunner())
    perf = [r for r in results if r.check == "perf"]
    assert len(perf) == 2 and all(r.status == "skip" and not r.required for r in perf)
    assert verdict(results)[0] == "certified"


def test_expect_gpus_wrong_count_fails_with_numbers():
    facts = cf.node(7)
    checks = orch.node_checks(facts, expect_gpus=8, expect_sku=None)
    count = next(r for r in checks if r.check == "inventory.count")
    assert count.status == "fail" and count.message == "actual 7 GPUs, expected 8"
    assert verdict(checks)[0] == "not_certified"


def test_expect_sku_names_the_wrong_gpu():
    facts = cf.node(gpus=[cf.gpu(0), cf.gpu(1, "NVIDIA H20", "unknown")])
    sku = next(r for r in orch.node_checks(facts, None, "H200") if r.check == "inventory.sku")
    assert sku.status == "fail" and "GPU 1: actual unknown (NVIDIA H20), expected H200" in sku.message


def test_no_gpu_is_error_everywhere_not_fail():
    facts = cf.no_gpu_node()
    checks = orch.node_checks(facts, 8, "H200")
    assert {r.check: r.status for r in checks} == {"detect": "error", "inventory.count": "error", "inventory.sku": "error"}
    assert verdict(checks)[0] == "inconclusive"


def test_gpu_without_target_is_error():
    (r,) = orch.target_checks((cf.gpu(0, target=None),))
    assert r.status == "error" and r.gpu == 0 and "not supported" in r.message


@pytest.mark.parametrize("text,want", [("all", None), ("0,2", (0, 2)), (" 3 ", (3,)), ("1,1", (1,))])
def test_parse_gpus(text, want):
    assert orch.parse_gpus(text) == want


@pytest.mark.parametrize("text", ["", "x", "-1", "0,,a"])
def test_parse_gpus_rejects(text):
    with pytest.raises(UsageError, match="--gpus"):
        orch.parse_gpus(text)


def test_select_gpus_unknown_index_is_usage_error():
    with pytest.raises(UsageError, match="no GPU 9"):
        orch.select_gpus(cf.node(8).gpus, (0, 9))
    assert [g.index for g in orch.select_gpus(cf.node(8).gpus, (0, 2))] == [0, 2]


def test_worker_env_one_gpu_and_fault_only_where_asked():
    env = {"KDACTL_FAULT": "hang", "KDACTL_FAULT_GPU": "3", "PATH": "/bin"}
    assert visible_devices_env(env, cf.uuid(3), 3)["KDACTL_FAULT"] == "hang"
    other = visible_devices_env(env, cf.uuid(1), 1)
    assert "KDACTL_FAULT" not in other and other["CUDA_VISIBLE_DEVICES"] == cf.uuid(1)
    assert visible_devices_env({"KDACTL_FAULT": "crash"}, "u", 0)["KDACTL_FAULT"] == "crash"


def test_worker_env_carries_the_nodes_target_and_sku_down():
    env = visible_devices_env({"KDACTL_CUDA_ARCH": "sm_80"}, cf.uuid(2), 2, "sm_90a", "H200")
    assert env["KDACTL_CUDA_ARCH"] == "sm_90a" and env["KDACTL_SKU"] == "H200"
    assert env["CUDA_VISIBLE_DEVICES"] == cf.uuid(2) and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# --- real worker processes -------------------------------------------------------------------


def _plan(*stages):
    return Plan(tuple(StageSpec(name, f"tests.certify_fakes:{fn}", timeout) for name, fn, timeout in stages))


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cf.ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, **extra}


def test_workers_run_per_gpu_in_parallel(tmp_path):
    runner = orch.SubprocessRunner(tmp_path / "logs")
    start = time.monotonic()
    results = orch.run_gpus(jobs(4, _env()), _plan(("sleep", "sleep_stage", 30)), runner)
    took = time.monotonic() - start
    assert [r.status for r in results] == ["pass"] * 4 and [r.gpu for r in results] == [0, 1, 2, 3]
    assert took < 4 * 0.6 + 1.5, f"4 GPUs of 0.6 s stages took {took:.1f} s: not parallel"
    assert (tmp_path / "logs" / "gpu3-sleep.log").is_file()


def test_worker_sees_only_its_gpu(tmp_path):
    results = orch.run_gpus(jobs(2, _env()), _plan(("fake", "pass_stage", 30)), orch.SubprocessRunner(tmp_path))
    assert cf.uuid(1) in results[1].message


def test_hung_stage_is_killed_and_inconclusive(tmp_path):
    plan = _plan(("suite", "hang_stage", 1.0), ("after", "pass_stage", 30))
    start = time.monotonic()
    results = orch.run_gpus(jobs(2, _env()), plan, orch.SubprocessRunner(tmp_path))
    assert time.monotonic() - start < 8
    hung = [r for r in results if r.check == "suite"]
    assert all(r.status == "error" and "timed out after 1 s" in r.message for r in hung)
    assert verdict(results)[0] == "inconclusive"


def test_segfault_is_error_and_kdactl_survives(tmp_path):
    results = orch.run_gpus(jobs(1, _env()), _plan(("build", "segfault_stage", 30)), orch.SubprocessRunner(tmp_path))
    (r,) = results
    assert r.status == "error" and "SIGSEGV" in r.message
    assert verdict(results)[0] == "inconclusive"


def test_stage_exception_is_one_line_error(tmp_path):
    (r,) = orch.run_gpus(jobs(1, _env()), _plan(("suite", "raise_stage", 30)), orch.SubprocessRunner(tmp_path))
    assert r.status == "error" and "RuntimeError: CUDA error: an illegal memory access" in r.message
    assert "second line" not in r.message


def test_empty_worker_result_is_error(tmp_path):
    (r,) = orch.run_gpus(jobs(1, _env()), _plan(("suite", "empty_stage", 30)), orch.SubprocessRunner(tmp_path))
    assert r.status == "error"


def test_fault_reaches_only_the_chosen_gpu(tmp_path):
    env = _env(KDACTL_FAULT="wrong-result:direct", KDACTL_FAULT_GPU="1")
    results = orch.run_gpus(jobs(3, env), _plan(("suite", "fault_env_stage", 30)), orch.SubprocessRunner(tmp_path))
    assert [r.status for r in results] == ["pass", "fail", "pass"]
    assert verdict(results)[0] == "not_certified"


def test_stderr_progress_lines():
    lines = []
    p = orch.StderrProgress(lines.append)
    job = jobs(1)[0]
    p.started(job, "suite")
    p.finished(job, "suite", [CheckResult("a", "pass"), CheckResult("b", "fail", "x")], 1.25)
    assert lines == ["kdactl certify: gpu0 suite ...", "kdactl certify: gpu0 suite: 1 fail, 1 pass (1.2 s)"]


def test_stage_groups_put_suite_and_sanitize_together_and_perf_alone():
    groups = [[s.name for s in g] for g in orch.stage_groups(default_plan(False).stages)]
    assert groups == [["build"], ["suite", "sanitize"], ["perf"]]
    assert [[s.name for s in g] for g in orch.stage_groups(default_plan(True).stages)] == [["build"], ["suite", "sanitize"]]
    bad = (StageSpec("a", "m:f", 1, overlaps=True), StageSpec("b", "m:f", 1, ("a",), overlaps=True))
    with pytest.raises(ValueError, match=r"stage b needs \['a'\], which run at the same time"):
        orch.stage_groups(bad)


def test_overlapping_stages_run_at_the_same_time():
    import threading

    both = threading.Barrier(2, timeout=10)  # passes only if suite and sanitize are in flight together

    def meet(job):
        both.wait()
        return [CheckResult("x", "pass", "")]

    runner = cf.FakeRunner({("suite", 0): meet, ("sanitize", 0): meet})
    results = orch.run_gpus(jobs(1), default_plan(False), runner)
    assert verdict(results)[0] == "certified"
    assert [c[0] for c in runner.calls][0] == "build" and [c[0] for c in runner.calls][-1] == "perf"


def test_a_failed_build_skips_both_overlapping_stages():
    runner = cf.FakeRunner({("build", 0): lambda j: [CheckResult("build", "fail", "nvcc failed")]})
    results = orch.run_gpus(jobs(1), default_plan(False), runner)
    skipped = {r.check: r.message for r in results if r.status == "skip"}
    assert skipped == {s: "not run: stage build did not pass" for s in ("suite", "sanitize", "perf")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped
        return f.read().split(") ")[-1][0] != "Z"


def _wait_for_pid(path, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the stage never started its child")


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_stopped_worker_takes_its_own_children_along(tmp_path, how):
    """The suite's pytest and the sanitizers lead sessions of their own; killing the worker's group
    alone would leave them on the GPU (seen on the H200 after a Ctrl-C: 5 compute processes left)."""
    import threading

    pidfile = tmp_path / "grandchild.pid"
    runner = orch.SubprocessRunner(tmp_path)
    plan = _plan(("suite", "grandchild_stage", 4.0 if how == "timeout" else 60))
    job = jobs(1, _env(KDACTL_TEST_PIDFILE=str(pidfile)))
    if how == "cancel":
        threading.Thread(target=lambda: (_wait_for_pid(pidfile), runner.cancel()), daemon=True).start()
    start = time.monotonic()
    (r,) = orch.run_gpus(job, plan, runner)
    pid = _wait_for_pid(pidfile)
    assert r.status == "error" and time.monotonic() - start < 15
    end = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pid), f"the worker's child {pid} outlived the worker ({how})"
