"""Which certify stage must catch each planted fault (KDACTL_FAULT, kdactl.faults), and a pure judge of
a faulted run's results against it: the contract that the GPU acceptance tests
(tests/test_acceptance_gpu.py) hold a real run to, and that the CPU tests hold the fakes to.

A fault is caught by its stage when the results that decide the verdict (the failures of a
not-certified run, else the errors of an inconclusive one) all belong to the stages the fault
reaches, the target stage among them, and one of them is the check named here. A fault that shows
up first somewhere else (a route smoke failing under ``slow``) is a finding about the pipeline, not
about the node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kdactl.faults import parse_fault
from kdactl.results import CheckResult, deciding, verdict

# The per-GPU stages (kdactl.certify.stages.default_plan) and the checks each one reports beside
# the one named after it; a check of no stage (inventory, target, health) is a node check.
BUILD_CHECKS = ("build", "selftest", "host-module")
NODE = "node"


@dataclass(frozen=True)
class Catch:
    stage: str  # the stage the fault targets: its checks must report it
    verdict: str  # the verdict the fault must produce
    check: str  # a regular expression that one deciding check's name must match ({route}: the fault's route)
    also: tuple[str, ...] = ()  # other stages that the same fault reaches by design


CATCHES: dict[str, Catch] = {
    # the route smokes perturb the route's output; the sanitizer payload runs the same smokes
    "wrong-result": Catch("suite", "not_certified", r"^suite\..*{route}", also=("sanitize",)),
    "sanitizer": Catch("sanitize", "not_certified", r"^sanitize\.memcheck$"),
    # the suite's first check sleeps forever (its time limit ends it) or aborts the suite's process
    "hang": Catch("suite", "inconclusive", r"^suite$"),
    "crash": Catch("suite", "inconclusive", r"^suite$"),
    # a co-tenant while perf times: not a slow node, so inconclusive, never failed
    "busy": Catch("perf", "inconclusive", r"^perf\.activity$"),
    # the same results in twice the time: only the perf gate can see it
    "slow": Catch("perf", "not_certified", r"^perf\["),
}


def stage_of(check: str) -> str:
    """The stage a result belongs to, from its check name: 'suite.test_routes::x' -> 'suite',
    'sanitize.memcheck' -> 'sanitize', 'perf[B1-T1024-H16]' -> 'perf', 'selftest' -> 'build',
    'inventory.count' -> 'node'."""
    if check in BUILD_CHECKS:
        return "build"
    head = re.split(r"[.\[]", check, maxsplit=1)[0]
    return head if head in ("suite", "sanitize", "perf") else NODE


def catch_for(fault_value: str) -> tuple[Catch, str]:
    """(the Catch of a KDACTL_FAULT value, the check pattern with its route filled in). ValueError
    for a value that is no fault, as kdactl.faults.parse_fault says."""
    fault = parse_fault(fault_value)
    if fault is None:
        raise ValueError("no fault: KDACTL_FAULT is empty")
    catch = CATCHES[fault.kind]
    return catch, catch.check.replace("{route}", re.escape(fault.route or ""))


def catch_problems(fault_value: str, results: Iterable[CheckResult]) -> list[str]:
    """Why a run with KDACTL_FAULT=``fault_value`` did not catch it where it must; [] when it did."""
    results = list(results)
    catch, pattern = catch_for(fault_value)
    problems = []
    got, _ = verdict(results)
    if got != catch.verdict:
        problems.append(f"verdict {got}, expected {catch.verdict}")
    decided = deciding(results)
    stages = {stage_of(r.check) for r in decided}
    allowed = {catch.stage, *catch.also}
    if catch.stage not in stages:
        problems.append(f"stage {catch.stage} reported nothing against the node")
    for r in decided:
        if stage_of(r.check) not in allowed:
            problems.append(f"{r.check} ({stage_of(r.check)} stage, {r.status}: {r.message[:200]}) is outside "
                            f"{', '.join(sorted(allowed))}")  # fmt: skip
    if not any(re.search(pattern, r.check) for r in decided):
        problems.append(f"no deciding check matches {pattern!r}: {', '.join(r.check for r in decided) or 'none'}")
    return problems
