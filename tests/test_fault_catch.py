"""Each planted fault (KDACTL_FAULT) is caught by the certify stage it targets: the map in
kdactl.certify.fault_catch, the stage of each real check name, and the real certify pipeline over
fake stages (tests.certify_fakes.fault_runner: each fault's own hook decides what a stage reports).
The same judge holds the real runs on a GPU (tests/test_acceptance_gpu.py)."""

from __future__ import annotations

import inspect

import pytest

from kdactl.assets import checks_dir
from kdactl.bench.baseline import GateRow
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.fault_catch import CATCHES, catch_for, catch_problems, stage_of
from kdactl.certify.stages import default_plan, judge_perf_activity, perf_results, perf_stage
from kdactl.faults import KINDS, is_active, perturb_output, wants_sanitizer_fault
from kdactl.hw.activity import Activity
from kdactl.kda.routes import ROUTES
from kdactl.results import VERDICT_EXIT, CheckResult, deciding
from kdactl.sanitizer.run import ToolRun
from kdactl.suite_plugin import check_name
from tests import certify_fakes as cf

FAULTS = [f"wrong-result:{r}" for r in ROUTES] + [k for k in KINDS if k != "wrong-result"]
PERF_FAULTS = [f for f in FAULTS if CATCHES[f.partition(":")[0]].stage == "perf"]


def certify(tmp_path, fault: str, quick: bool = False, runner=None):
    s = cf.settings(tmp_path, KDACTL_FAULT=fault)
    return certify_command(
        s, CertifyOptions(quick=quick), cf.deps(cf.node(2), runner or cf.fault_runner(), quick=quick)
    )


def results(rep) -> list[CheckResult]:
    return [CheckResult.from_json(r) for r in rep.cert["results"]]


def test_every_fault_kind_names_a_stage_of_the_full_plan():
    stages = {s.name for s in default_plan(False).stages}
    assert set(CATCHES) == set(KINDS)
    for kind, catch in CATCHES.items():
        assert {catch.stage, *catch.also} <= stages, kind


def test_stage_of_the_names_real_checks_carry():
    assert stage_of(check_name("checks/test_routes.py::test_route_smoke[x-chunk]")) == "suite"
    assert stage_of("suite") == "suite"  # the suite's whole-run error (timeout, crash)
    assert stage_of(ToolRun("racecheck", "pass", "ok", 1.0).result(0).check) == "sanitize"
    perf = perf_results([GateRow("B1-T1024-H16", "pass", 1.0, 1.0, 1.1, 0.99)], 0, [], "kineto")
    assert [stage_of(r.check) for r in judge_perf_activity(perf, Activity(None, "power cap"))] == ["perf"] * 3
    assert [stage_of(c) for c in ("build", "selftest", "host-module")] == ["build"] * 3
    assert [stage_of(c) for c in ("inventory.count", "target", "fault_injection", "suiteish")] == ["node"] * 4


def test_each_hook_fires_for_its_own_fault_only():
    """Which of kdactl.faults' hooks a value sets off, and the stage that calls that hook."""
    hook_stage = {"perturb_output": "suite", "hang_or_crash": "suite", "wants_sanitizer_fault": "sanitize",
                  "busy": "perf", "slow": "perf"}  # fmt: skip
    for fault in FAULTS:
        env = {"KDACTL_FAULT": fault}
        fired = {"perturb_output"} if any(perturb_output(r, 0.0, env) != 0.0 for r in ROUTES) else set()
        fired |= {"hang_or_crash"} if is_active("hang", env) or is_active("crash", env) else set()
        fired |= {"wants_sanitizer_fault"} if wants_sanitizer_fault(env) else set()
        fired |= {k for k in ("busy", "slow") if is_active(k, env)}
        assert len(fired) == 1 and hook_stage[fired.pop()] == catch_for(fault)[0].stage, fault
    # where those hooks are called: the suite's session fixture, the sanitizer payload, the perf stage
    assert "hang_or_crash()" in (checks_dir() / "conftest.py").read_text()
    assert "faults.wants_sanitizer_fault()" in (checks_dir() / "payload.py").read_text()
    assert 'is_active("busy", ctx.settings.env)' in inspect.getsource(perf_stage)


@pytest.mark.parametrize("fault", FAULTS)
def test_full_certify_catches_each_fault_in_its_stage(tmp_path, fault):
    rep = certify(tmp_path, fault)
    catch, _ = catch_for(fault)
    assert catch_problems(fault, results(rep)) == []
    assert rep.exit_code == VERDICT_EXIT[catch.verdict] and rep.cert["options"]["fault"] == fault
    assert not any(r["check"] == "fault_injection" for r in rep.cert["results"])


@pytest.mark.parametrize("fault", [f for f in FAULTS if f not in PERF_FAULTS])
def test_quick_certify_catches_the_faults_outside_perf(tmp_path, fault):
    rep = certify(tmp_path, fault, quick=True)
    assert catch_problems(fault, results(rep)) == []


@pytest.mark.parametrize("fault", PERF_FAULTS)
def test_quick_certify_cannot_see_a_perf_fault_and_says_so(tmp_path, fault):
    rep = certify(tmp_path, fault, quick=True)
    assert rep.exit_code == 3 and "no check caught it" in rep.reason
    assert any("stage perf reported nothing" in p for p in catch_problems(fault, results(rep)))


def test_slow_caught_by_a_route_smoke_is_a_pipeline_finding(tmp_path):
    """KDACTL_FAULT=slow launching every call twice corrupts an in-place state pool: a route smoke
    fails before the perf gate sees the slowdown. The verdict is right, the stage is not."""
    runner = cf.fault_runner()
    runner.behaviours[("suite", None)] = lambda j: [
        CheckResult("suite.test_routes::test_route_smoke_pool[B2-T1024-H16-chunk]", "fail", "error ratio 0.41 > 5e-3")
    ]
    rep = certify(tmp_path, "slow", runner=runner)
    assert rep.exit_code == 1
    problems = catch_problems("slow", results(rep))
    assert len(problems) == 2  # one per GPU of the fake node
    assert all(
        p.startswith("suite.test_routes::test_route_smoke_pool") and p.endswith("is outside perf") for p in problems
    )


def test_every_fault_has_a_gpu_acceptance_run():
    from tests.test_acceptance_gpu import FULL_FAULTS, QUICK_FAULTS

    assert sorted(QUICK_FAULTS + FULL_FAULTS) == sorted(FAULTS)
    assert not set(QUICK_FAULTS) & set(PERF_FAULTS)  # --quick runs no perf stage


def test_the_verdict_deciding_results():
    fail, err = CheckResult("perf[a]", "fail", "slow"), CheckResult("suite", "error", "timed out")
    skipped = CheckResult("perf", "skip", "no baseline")
    assert deciding([fail, err, skipped]) == [fail]
    assert deciding([err, skipped, CheckResult("x", "skip", "n/a", required=False)]) == [err, skipped]


def test_a_wrong_result_must_name_its_route(tmp_path):
    rep = certify(tmp_path, "wrong-result:chunk")
    wrong_route = [r if r.status != "fail" else CheckResult(r.check.replace("chunk", "direct"), "fail", r.message)
                   for r in results(rep)]  # fmt: skip
    assert any("no deciding check matches" in p for p in catch_problems("wrong-result:chunk", wrong_route))
    with pytest.raises(ValueError, match="no fault"):
        catch_for("")
