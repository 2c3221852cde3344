"""Fakes for certify tests: a node of N fake H200s, an in-process stage runner, and stage functions
that a real worker process can run (``tests.certify_fakes:<name>``) to pass, hang or crash."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kdactl.certify.command import Deps
from kdactl.certify.fingerprint import Artifact
from kdactl.certify.orchestrate import GpuJob, NullProgress
from kdactl.certify.stages import Plan, StageSpec, default_plan
from kdactl.hw.facts import GpuFacts, NodeFacts
from kdactl.hw.health import HealthFacts
from kdactl.hw.toolkit import Toolkit
from kdactl.kda.routes import ROUTES
from kdactl.results import CheckResult
from kdactl.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
SHA = "ab" * 32  # the library's bytes
BUILD = "ef" * 32  # its build inputs (kdactl.jit.cache.build_key)
ARTIFACT = Artifact(SHA, BUILD)


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


HEALTHY = HealthFacts(
    ecc_uncorrected={"volatile": 0, "aggregate": 0}, remap={"corrected": 0, "uncorrected": 0, "pending": 0, "failed": 0},
    retired_pages={"single_bit": 0, "double_bit": 0, "pending": 0}, pcie={"gen": 5, "max_gen": 5, "width": 16, "max_width": 16},
    clocks_mhz={"sm": 1980, "sm_max": 1980, "mem": 3201, "mem_max": 3201}, xids=(),
)  # fmt: skip


def gpu(i: int, name: str = "NVIDIA H200", sku: str = "H200", target: str | None = "sm_90a", health=HEALTHY) -> GpuFacts:
    reason = "cc 9.0 with CUDA toolkit 13.0 (nvcc)" if target else "compute capability 7.5 is not supported"
    return GpuFacts(i, uuid(i), name, sku, (9, 0), 132, 143771, 62914560, "disabled", "enabled", target, reason, health)


def node(n: int = 8, **kw) -> NodeFacts:
    gpus = tuple(kw.pop("gpus", None) or (gpu(i) for i in range(n)))
    return NodeFacts(
        host_arch="x86_64", driver_version=kw.get("driver", "580.159.04"), cuda_driver=(13, 0), driver_source="nvml",
        toolkit=Toolkit("/usr/local/cuda/bin/nvcc", (13, 0), "Build cuda_13.0"), torch_version="2.13.0", torch_cuda="13.0",
        cuda_arch_override=None, gpus=gpus, warnings=(), error=kw.get("error"),
    )  # fmt: skip


def no_gpu_node() -> NodeFacts:
    err = "no NVIDIA driver: NVML init failed: NVML Shared Library Not Found"
    return NodeFacts("x86_64", None, None, None, None, "2.13.0", None, None, (), (), err)


Behaviour = Callable[[GpuJob], list[CheckResult]]


@dataclass
class FakeRunner:
    """Each (stage, gpu) -> a function of the job; default: one pass per stage."""

    behaviours: dict[tuple[str, int | None], Behaviour] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)

    def run(self, spec: StageSpec, job: GpuJob) -> list[CheckResult]:
        self.calls.append((spec.name, job.index))
        fn = self.behaviours.get((spec.name, job.index)) or self.behaviours.get((spec.name, None))
        return fn(job) if fn else [CheckResult(spec.name, "pass", "ok", 0.01)]


def fault_aware(job: GpuJob, stage: str) -> list[CheckResult]:
    """What the real stages report under KDACTL_FAULT, as the orchestrator sees it: each fault's own
    hook (kdactl.faults) decides, and the perf stage's results come from its real judges
    (perf_results, judge_perf_activity). Check names are the real ones (suite.<module>::<test>,
    sanitize.<tool>, perf[<shape>], perf.activity)."""
    from kdactl.certify.stages import judge_perf_activity, perf_results
    from kdactl.faults import is_active, perturb_output, wants_sanitizer_fault
    from kdactl.hw.activity import Activity

    env = dict(job.env)
    only = env.get("KDACTL_FAULT_GPU")
    if only and only != str(job.index):
        env.pop("KDACTL_FAULT", None)
    if stage == "suite":
        if is_active("hang", env):
            return [CheckResult("suite", "error", "validation suite timed out after 45 s and was killed (a hung check?)")]
        if is_active("crash", env):
            return [CheckResult("suite", "error", "pytest exited -6 (killed by signal 6) without a results file (crashed?)")]
        wrong = [r for r in ROUTES if perturb_output(r, 0.0, env) != 0.0]
        if wrong:
            return [CheckResult(f"suite.test_routes::test_route_smoke[{r}]", "fail", "error ratio 0.3 > 5e-3") for r in wrong]
    if stage == "sanitize" and wants_sanitizer_fault(env):  # (the payload's own smokes under wrong-result: not modelled)
        return [CheckResult("sanitize.memcheck", "fail", "memcheck: ERROR SUMMARY: 1 error")]
    if stage == "perf" and (is_active("slow", env) or is_active("busy", env)):
        from kdactl.bench.baseline import GateRow  # imports torch: only where a perf fault asks for it

        slow = 2.0 if is_active("slow", env) else 1.0
        rows = [GateRow("B1-T4096-H8", "regressed" if slow > 1 else "pass", slow, 1.0, 1.1, slow * 0.98)]
        results = perf_results(rows, 1 if slow > 1 else 0, [], "kineto")
        busy = "GPU busy: 1 other process on the GPU while it was timed (pids 4242)" if is_active("busy", env) else None
        return judge_perf_activity(results, Activity(busy, None))
    return [CheckResult(stage, "pass", "ok", 0.01)]


def fault_runner() -> FakeRunner:
    return FakeRunner({(s, None): (lambda j, s=s: fault_aware(j, s)) for s in ("build", "suite", "sanitize", "perf")})


def deps(facts: NodeFacts, runner: FakeRunner | None = None, plan: Plan | None = None, quick: bool = False, **kw) -> Deps:
    return Deps(
        gather=lambda s: facts, runner=runner or FakeRunner(), plan=plan or default_plan(quick), progress=NullProgress(),
        now=kw.get("now", lambda: NOW), hostname=lambda: "node-a", sanitizer_version=lambda s: "2025.2.1",
        artifacts=lambda s, targets: ({t: ARTIFACT for t in targets}, {}),
    )  # fmt: skip


def settings(tmp_path: Path, **env: str) -> Settings:
    base = {"HOME": str(tmp_path), "KDACTL_DATA_DIR": str(tmp_path / "data"), "KDACTL_CACHE_DIR": str(tmp_path / "cache")}
    return Settings.from_env({**base, **env})


# --- stage functions for a real worker process -----------------------------------------------


def pass_stage(ctx) -> list[CheckResult]:
    return [CheckResult("fake", "pass", f"gpu {ctx.gpu} sees CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")]


def sleep_stage(ctx) -> list[CheckResult]:
    time.sleep(0.6)
    return [CheckResult("sleep", "pass", f"slept on gpu {ctx.gpu}")]


def hang_stage(ctx) -> list[CheckResult]:
    time.sleep(3600)
    return []


def grandchild_stage(ctx) -> list[CheckResult]:
    """Like the suite stage: a child in a session of its own (proc.run_process), here one that hangs;
    its pid goes to $KDACTL_TEST_PIDFILE so the test can see whether it outlived the worker."""
    import sys

    from kdactl.proc import run_process

    code = f"import os, time; open({os.environ['KDACTL_TEST_PIDFILE']!r}, 'w').write(str(os.getpid())); time.sleep(3600)"
    run_process([sys.executable, "-c", code], env=os.environ, timeout_s=3600)
    return []


def segfault_stage(ctx) -> list[CheckResult]:
    os.kill(os.getpid(), signal.SIGSEGV)
    return []


def raise_stage(ctx) -> list[CheckResult]:
    raise RuntimeError("CUDA error: an illegal memory access was encountered\nsecond line")


def empty_stage(ctx) -> list[CheckResult]:
    return []


def fault_env_stage(ctx) -> list[CheckResult]:
    fault = os.environ.get("KDACTL_FAULT", "")
    return [CheckResult("fault_seen", "fail" if fault else "pass", fault or "none")]


# --- sealed certificates of the wrong shape ---------------------------------------------------

# (where, value, the problem named): wrong types below the top level that the digest alone let
# through, sealed with kdactl's own seal so that only the shape is wrong
WRONG_TYPES = [
    (("node", "hostname"), {"name": "node-a"}, "node.hostname is an object, expected a string"),
    (("scope",), ["full"], "scope ['full'] is not one of 'full', 'quick'"),
    (("gpus", 0, "uuid"), [uuid(0)], "gpus[0].uuid is a list, expected a string"),
    (("gpus", 0, "index"), "0", "gpus[0].index is a string, expected an integer"),
    (("gpus", 0, "target"), {"sm": 90}, "gpus[0].target is an object, expected a string or null"),
    (("node", "fingerprint"), "ab" * 32, "node.fingerprint is a string, expected an object"),
    (("versions",), {}, "versions lacks kdactl"),
    (("results", 0, "duration_s"), "0.01", "results[0].duration_s is a string, expected a number"),
    (("gpus", 0, "sku"), 5, "gpus[0].sku is an integer, expected a string"),
]  # fmt: skip
# JSON text Python's json reads without complaint, put where results[0].duration_s was: (text, problem)
BAD_TOKENS = [
    ("Infinity", "Infinity is not a JSON number"),
    ("NaN", "NaN is not a JSON number"),
    ("1e400", "number 1e400 overflows to infinity"),
    ("[" * 50_000 + "]" * 50_000, "nesting is deeper than 16 levels"),
    ("[" * 20 + "]" * 20, "results[0].duration_s[0][0][0][0][0][0][0][0][0][0][0][0][0]: nesting is deeper than 16 levels"),
]  # fmt: skip
_PLACEHOLDER = 123.456789


def reseal_changed(path: Path, where: tuple | None = None, value=None, token: str | None = None, key: bytes | None = None) -> Path:
    """The certificate at ``path`` with one value changed, sealed again (a valid digest); ``token``
    is JSON text written in place of results[0].duration_s after sealing (no seal can hold it)."""
    import json

    from kdactl.certify import certificate as cm

    doc = json.loads(path.read_text())
    if token is not None:
        where, value = ("results", 0, "duration_s"), _PLACEHOLDER
    node = doc
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    text = cm.certificate_text(cm.seal(doc, key))
    if token is not None:
        assert text.count(repr(_PLACEHOLDER)) == 1
        text = text.replace(repr(_PLACEHOLDER), token)
    path.write_text(text)
    return path
