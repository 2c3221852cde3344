"""The per-GPU stages of a certification, described as data, and the real stage functions that a
worker process (worker.py) runs on one GPU.

A stage function takes a StageContext and returns a list of CheckResult; it runs in its own
process with CUDA_VISIBLE_DEVICES set to its GPU, so the GPU is device 0 there. What a stage cannot
judge is ``error``; a stage that ran nothing is ``skip`` with the reason (never a pass).

Plans (decisions):

- full: build (load the library + device self-test), then at once suite (kdactl.suite.run_suite: JIT contracts,
  route smokes, stream and graph tests), sanitize (all four compute-sanitizer tools), perf (bench's
  smoke suite gated against fleet/baselines/<SKU>.toml, alone on the GPU). Every stage is required. With no baseline
  for the SKU the perf check is a required ``skip`` that names the missing file: the node is then
  inconclusive, because an unmeasured node is not a certified one. Record a baseline on a known good
  node of that SKU first (``kdactl bench --suite smoke --peers none --record-baseline``).
- quick (target: under 30 s with a warm cache): build, then at once the suite in its quick form
  (contracts and route smokes) and memcheck only. The perf gate is reported as a skip that is not required, and the
  certificate records ``"scope": "quick"``; ``kdactl gate`` does not accept a quick certificate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kdactl.results import CheckResult
from kdactl.settings import Settings

_HERE = "kdactl.certify.stages"
SUITE_TIMEOUT_S = {False: 300.0, True: 45.0}  # pytest's own limit; the stage's limit is longer
SANITIZE_TIMEOUT_S = {False: 240.0, True: 60.0}  # per compute-sanitizer run (control, payload)


@dataclass(frozen=True)
class StageSpec:
    name: str
    impl: str  # "module:function" that the worker imports and calls
    timeout_s: float
    needs: tuple[str, ...] = ()  # stages of the same GPU that must have passed first
    # May run at the same time as the overlapping stages next to it in the plan (never perf: its
    # timings need the GPU to themselves). Its needs must come before that group.
    overlaps: bool = False


@dataclass(frozen=True)
class Plan:
    stages: tuple[StageSpec, ...]
    not_run: tuple[tuple[str, str], ...] = ()  # (check, reason): skipped by design, not required


def default_plan(quick: bool) -> Plan:
    build = StageSpec("build", f"{_HERE}:build_stage", 900.0)  # a cold JIT build takes minutes
    if quick:
        return Plan(
            (build, StageSpec("suite", f"{_HERE}:suite_stage", 75.0, ("build",), overlaps=True),
             StageSpec("sanitize", f"{_HERE}:sanitize_stage", 150.0, ("build",), overlaps=True)),
            (("perf", "not run with --quick (the full certify gates performance)"),),
        )  # fmt: skip
    return Plan((
        build,
        StageSpec("suite", f"{_HERE}:suite_stage", 600.0, ("build",), overlaps=True),
        StageSpec("sanitize", f"{_HERE}:sanitize_stage", 1500.0, ("build",), overlaps=True),
        StageSpec("perf", f"{_HERE}:perf_stage", 300.0, ("build",)),
    ))  # fmt: skip


@dataclass(frozen=True)
class StageContext:
    settings: Settings
    gpu: int  # the GPU's NVML index on the node (for labels); inside the worker it is device 0
    target: str
    sku: str
    quick: bool


def error(check: str, message: str, gpu: int | None = None, duration_s: float = 0.0) -> CheckResult:
    return CheckResult(check, "error", message, duration_s, gpu)


# ---------------------------------------------------------------------------------------------
# The real stages (run inside a worker process; torch is imported here, never by the parent's gate)


def build_stage(ctx: StageContext) -> list[CheckResult]:
    """Load (or build) the kernel library for this GPU's target and run the device self-test."""
    from concurrent.futures import ThreadPoolExecutor

    from kdactl.jit.library import load_kernels
    from kdactl.jit.selftest import run_selftest

    with ThreadPoolExecutor(1) as pool:  # both builds are nvcc processes: side by side
        host = pool.submit(host_module_check, ctx)
        kernels = load_kernels(ctx.settings, ctx.target)
        host_result = host.result()
    sha = kernels.manifest.get("files", {}).get(kernels.manifest.get("library"), "?")
    how = {"built": f"built in {kernels.build_s:.1f} s", "cache": "from the cache", "aot": "from the AOT bundle"}
    out = [CheckResult("build", "pass", f"{kernels.path} ({how.get(kernels.origin, kernels.origin)}), sha256 {sha}",
                       kernels.build_s + kernels.load_s)]  # fmt: skip
    test = run_selftest(kernels, 0)
    if test.passed:
        out.append(CheckResult("selftest", "pass", f"{test.n} values correct", test.duration_s))
    else:
        out.append(
            CheckResult(
                "selftest",
                "fail",
                f"{test.mismatches} of {test.n} values wrong, first {test.first_mismatch}",
                test.duration_s,
            )
        )
    return [*out, host_result]


def host_module_check(ctx: StageContext) -> CheckResult:
    """kdactl_host, the planned eager path in C++ (built or loaded here, for the suite and payloads
    after this stage): pass, or warn when eager calls will keep their plans in Python (slower per
    call, the same results)."""
    import time

    from kdactl.errors import KdactlError
    from kdactl.jit.host import DISABLE_ENV, disabled, load_host_module

    if disabled(ctx.settings):
        return CheckResult("host-module", "warn", f"{DISABLE_ENV}={ctx.settings.env.get(DISABLE_ENV)}: eager calls "
                                                  "keep their plans in Python")  # fmt: skip
    start = time.monotonic()
    try:
        _, entry = load_host_module(ctx.settings, ctx.target)
    except (KdactlError, OSError) as err:
        return CheckResult("host-module", "warn", f"eager calls keep their plans in Python: {err}",
                           time.monotonic() - start)  # fmt: skip
    how = f"built in {entry.build_s:.1f} s" if entry.built else "from the cache"
    return CheckResult("host-module", "pass", f"{entry.library} ({how})", time.monotonic() - start)


def suite_stage(ctx: StageContext) -> list[CheckResult]:
    """The validation suite (checks/) on this GPU: kdactl.suite.run_suite."""
    from kdactl.suite import run_suite

    # The children see this worker's own GPU (its UUID, set by the orchestrator), not an index.
    return list(run_suite(ctx.gpu, quick=ctx.quick, timeout_s=SUITE_TIMEOUT_S[ctx.quick], env=os.environ,
                          visible=os.environ.get("CUDA_VISIBLE_DEVICES")))  # fmt: skip


def sanitize_stage(ctx: StageContext) -> list[CheckResult]:
    """compute-sanitizer runs on this GPU (kdactl.sanitizer.run.run_sanitizers: positive control, then
    the payload of every route, per tool); memcheck only in --quick."""
    from kdactl.sanitizer.run import TOOLS, run_sanitizers

    tools = ("memcheck",) if ctx.quick else TOOLS
    return list(run_sanitizers(ctx.settings, tools=tools, gpu=ctx.gpu, timeout_s=SANITIZE_TIMEOUT_S[ctx.quick],
                               visible=os.environ.get("CUDA_VISIBLE_DEVICES")))  # fmt: skip


def perf_stage(ctx: StageContext) -> list[CheckResult]:
    """bench's smoke suite on the auto route, gated against fleet/baselines/<SKU>.toml with the
    baseline's own timer, while NVML watches the GPU for other processes and throttling."""
    from kdactl.bench import baseline as bl

    path = bl.default_path(ctx.sku) if ctx.sku != "unknown" else None
    if path is None or not path.is_file():
        where = f"no baseline at {path}" if path else f"SKU {ctx.sku!r} has no baseline"
        return [CheckResult("perf", "skip", f"{where}: record one on a known good {ctx.sku} node with "
                            "'kdactl bench --suite smoke --peers none --record-baseline'; a node whose speed "
                            "was not checked is not certified")]  # fmt: skip
    from kdactl.bench import BenchOptions, run_bench
    from kdactl.bench.timing import TIMERS
    from kdactl.faults import is_active, start_cotenant, stop_cotenant
    from kdactl.hw.activity import judge_activity, own_pids, watched

    recorded = bl.load(path).meta.get("timer")
    opts = BenchOptions(suite="smoke", routes="auto", peers="none", gate=True, device=0, as_json=True,
                        timer=recorded if recorded in TIMERS else "auto")  # fmt: skip
    cotenant = start_cotenant() if is_active("busy", ctx.settings.env) else None
    try:
        report, samples, problems = watched(ctx.gpu, lambda: run_bench(ctx.settings, opts))
    finally:
        if cotenant is not None:
            stop_cotenant(cotenant)
    results = perf_results(report.gate_rows, report.exit_code, report.reasons, report.info.get("timer"))
    if not samples:
        return results + [CheckResult("perf.activity", "warn", "could not check the GPU for other processes or "
                                      f"throttling: {'; '.join(problems[:2]) or 'no NVML sample'}")]  # fmt: skip
    return judge_perf_activity(results, judge_activity(samples, own_pids()))


def judge_perf_activity(results: list[CheckResult], activity: Any) -> list[CheckResult]:
    """A busy GPU is not a failed one: timings taken beside another process become ``error``
    (inconclusive) with the reason, except a wrong result, which fails whatever else ran. Throttling
    is a warning."""
    out = list(results)
    if activity.busy:
        out = [
            r
            if r.status == "pass" or r.check == "perf.reference_check"
            else replace(r, status="error", message=f"{activity.busy}; timing not judged ({r.message})")
            for r in out
        ]
        out.append(CheckResult("perf.activity", "error", activity.busy))
    else:
        out.append(CheckResult("perf.activity", "pass", "no other process on the GPU while it was timed"))
    if activity.throttle:
        out.append(CheckResult("perf.throttle", "warn", activity.throttle))
    return out


_ROW_STATUS = {
    "pass": "pass",
    "regressed": "fail",
    "slower-within-noise": "warn",
    "route-changed": "warn",
    "no-baseline": "error",
    "not-measured": "error",
    "timer-mismatch": "error",
}


def perf_results(rows: list[Any], exit_code: int, reasons: list[str], timer: str | None = None) -> list[CheckResult]:
    """One result per gated shape (measured, baseline, threshold in ms, the timer); a wrong result
    found while benchmarking fails the node even where the gate could not judge the time."""
    out = []
    for r in rows:
        perf = {"shape": r.label, "measured": r.measured_ms, "baseline": r.baseline_ms, "threshold": r.threshold_ms,
                "unit": "ms", "timer": timer}  # fmt: skip
        out.append(CheckResult(f"perf[{r.label}]", _ROW_STATUS.get(r.status, "error"), r.message, perf=perf))
    if exit_code == 1 and not any(x.status == "fail" for x in out):
        out.append(CheckResult("perf.reference_check", "fail", "; ".join(reasons) or "bench found a wrong result"))
    if not out:
        out.append(error("perf", "; ".join(reasons) or "bench gated no shape"))
    return out


SKU_ENV = "KDACTL_SKU"  # the SKU certify classified, for the suite and the bench below it


def visible_devices_env(env: Mapping[str, str], uuid: str, gpu: int, target: str | None = None,
                        sku: str | None = None) -> dict[str, str]:  # fmt: skip
    """The worker's environment, which its children (pytest, compute-sanitizer, bench) inherit: this
    GPU only, by UUID; the target and SKU the node decided, so that no child derives them again;
    KDACTL_FAULT kept only for KDACTL_FAULT_GPU (when set)."""
    out = dict(env)
    out["CUDA_VISIBLE_DEVICES"] = uuid
    out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if target:
        out["KDACTL_CUDA_ARCH"] = target
    if sku:
        out[SKU_ENV] = sku
    only = out.get("KDACTL_FAULT_GPU")
    if only not in (None, "") and only.strip() != str(gpu):
        out.pop("KDACTL_FAULT", None)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out
