"""Run a certification: node-level checks in this process (detect, inventory, target), then every
selected GPU in parallel, each stage of a GPU in its own worker process with its own time limit.

A hung stage is killed (its process group) and reported as ``error``; a crash (segfault, abort) is
``error`` with the signal and the tail of its log; kdactl itself survives both. A stage that
returns nothing is ``error``; a stage whose prerequisite did not pass is a required ``skip``.
Either makes the node inconclusive at best, never certified.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from kdactl.certify.stages import Plan, StageSpec, error, visible_devices_env
from kdactl.errors import UsageError
from kdactl.proc import INTERRUPTED, Children, run_process
from kdactl.results import CheckResult

LOG_TAIL = 400  # characters of a dead worker's output quoted in its result


@dataclass(frozen=True)
class GpuJob:
    index: int
    uuid: str
    target: str
    sku: str
    quick: bool
    env: Mapping[str, str] = field(repr=False, default_factory=dict)


class StageRunner(Protocol):
    def run(self, spec: StageSpec, job: GpuJob) -> list[CheckResult]: ...


class Progress(Protocol):
    def started(self, job: GpuJob, stage: str) -> None: ...

    def finished(self, job: GpuJob, stage: str, results: list[CheckResult], seconds: float) -> None: ...


class NullProgress:
    def started(self, job: GpuJob, stage: str) -> None:
        pass

    def finished(self, job: GpuJob, stage: str, results: list[CheckResult], seconds: float) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Options and node-level checks (pure)


def parse_gpus(text: str) -> tuple[int, ...] | None:
    """'all' -> None; '0,2' -> (0, 2). UsageError names the option and the value."""
    text = text.strip()
    if text == "all":
        return None
    try:
        picked = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    except ValueError:
        picked = ()
    if not picked or any(i < 0 for i in picked):
        raise UsageError(f"--gpus takes 'all' or a comma list of GPU indices like 0,2; got {text!r}")
    return picked


def select_gpus(gpus: tuple[Any, ...], picked: tuple[int, ...] | None) -> tuple[Any, ...]:
    if picked is None or not gpus:
        return gpus
    have = {g.index for g in gpus}
    unknown = [i for i in picked if i not in have]
    if unknown:
        raise UsageError(
            f"--gpus {','.join(map(str, picked))}: no GPU {','.join(map(str, unknown))} on this node (it has {','.join(map(str, sorted(have)))})"
        )
    return tuple(g for g in gpus if g.index in picked)


def node_checks(facts: Any, expect_gpus: int | None, expect_sku: str | None) -> list[CheckResult]:
    """detect, inventory.count, inventory.sku: the checks that need only the facts."""
    out = []
    if facts.error or not facts.gpus:
        out.append(error("detect", facts.error or "no NVIDIA GPU found"))
    else:
        models = sorted({g.name for g in facts.gpus})
        out.append(
            CheckResult(
                "detect", "pass", f"{len(facts.gpus)} GPUs ({', '.join(models)}), driver {facts.driver_version}"
            )
        )
    if expect_gpus is not None:
        out.append(_count_check(facts, expect_gpus))
    if expect_sku is not None:
        out.append(_sku_check(facts, expect_sku))
    return out


def _count_check(facts: Any, expect: int) -> CheckResult:
    if facts.driver_version is None:  # no driver answered: nothing was counted
        return error("inventory.count", f"cannot count GPUs (expected {expect}): {facts.error}")
    n = len(facts.gpus)
    status = "pass" if n == expect else "fail"
    return CheckResult("inventory.count", status, f"actual {n} GPUs, expected {expect}")


def _sku_check(facts: Any, expect: str) -> CheckResult:
    if not facts.gpus:
        return error("inventory.sku", f"cannot read GPU SKUs (expected {expect}): {facts.error or 'no GPU'}")
    wrong = [f"GPU {g.index}: actual {g.sku} ({g.name}), expected {expect}" for g in facts.gpus if g.sku != expect]
    if wrong:
        return CheckResult("inventory.sku", "fail", "; ".join(wrong))
    return CheckResult("inventory.sku", "pass", f"all {len(facts.gpus)} GPUs are {expect}")


def health_checks(gpus: tuple[Any, ...]) -> list[CheckResult]:
    """Per GPU: the health facts read at detection, judged (kdactl.hw.health)."""
    from kdactl.hw.health import judge_health

    return [r for g in gpus for r in judge_health(g.health, g.index)]


def target_checks(gpus: tuple[Any, ...]) -> list[CheckResult]:
    """Per GPU: the kernel target chosen, or why there is none (inconclusive, SPEC)."""
    out = []
    for g in gpus:
        if g.target is None:
            out.append(
                error("target", f"no kernel target for {g.name} (cc {g.cc[0]}.{g.cc[1]}): {g.target_reason}", g.index)
            )
        else:
            out.append(CheckResult("target", "pass", f"{g.target} ({g.target_reason})", gpu=g.index))
    return out


# ---------------------------------------------------------------------------------------------
# Running the stages of every GPU


def run_gpus(
    jobs: list[GpuJob], plan: Plan, runner: StageRunner, progress: Progress | None = None
) -> list[CheckResult]:
    """Every job in parallel (one thread, hence one worker process at a time, per GPU); results in
    GPU order."""
    if not jobs:
        return []
    prog = progress or NullProgress()
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="kdactl-gpu") as pool:
        try:
            per_gpu = list(pool.map(lambda j: run_gpu(j, plan, runner, prog), jobs))
        except BaseException:  # Ctrl-C: stop the workers, or leaving the pool waits out every stage's time limit
            getattr(runner, "cancel", lambda: None)()
            raise
    return [r for results in per_gpu for r in results]


def stage_groups(stages: tuple[StageSpec, ...]) -> list[tuple[StageSpec, ...]]:
    """The plan's stages in the groups that run at once: each run of adjacent overlapping stages,
    and every other stage alone. ValueError when a stage needs one of its own group."""
    groups: list[list[StageSpec]] = []
    for spec in stages:
        if spec.overlaps and groups and groups[-1][-1].overlaps:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    for group in groups:
        names = {s.name for s in group}
        for spec in group:
            if names.intersection(spec.needs):
                raise ValueError(
                    f"stage {spec.name} needs {sorted(names.intersection(spec.needs))}, which run at the same time"
                )
    return [tuple(g) for g in groups]


def run_gpu(job: GpuJob, plan: Plan, runner: StageRunner, progress: Progress) -> list[CheckResult]:
    out: list[CheckResult] = []
    passed: dict[str, bool] = {}
    for group in stage_groups(plan.stages):
        with ThreadPoolExecutor(max_workers=len(group), thread_name_prefix=f"kdactl-gpu{job.index}") as pool:
            per_stage = list(pool.map(lambda spec: _run_stage(spec, job, passed, runner, progress), group))
        for spec, results in zip(group, per_stage):
            passed[spec.name] = stage_passed(results)
            out += results
    out += [CheckResult(name, "skip", why, gpu=job.index, required=False) for name, why in plan.not_run]
    return out


def _run_stage(spec: StageSpec, job: GpuJob, passed: dict[str, bool], runner: StageRunner,
               progress: Progress) -> list[CheckResult]:  # fmt: skip
    blocked = [n for n in spec.needs if not passed.get(n)]
    if blocked:
        results = [CheckResult(spec.name, "skip", f"not run: stage {', '.join(blocked)} did not pass")]
    else:
        progress.started(job, spec.name)
        start = time.monotonic()
        results = _guarded(runner, spec, job)
        progress.finished(job, spec.name, results, time.monotonic() - start)
    return [replace(r, gpu=job.index) for r in results]


def _guarded(runner: StageRunner, spec: StageSpec, job: GpuJob) -> list[CheckResult]:
    try:
        results = list(runner.run(spec, job))
    except Exception as err:  # noqa: BLE001 - one GPU's trouble must not stop the others
        return [error(spec.name, f"could not run stage {spec.name}: {type(err).__name__}: {err}")]
    return results or [error(spec.name, f"stage {spec.name} reported no results: no evidence")]


def stage_passed(results: list[CheckResult]) -> bool:
    return bool(results) and all(
        r.status in ("pass", "warn") or (r.status == "skip" and not r.required) for r in results
    )


class SubprocessRunner:
    """Runs ``python -m kdactl.certify.worker`` for one stage on one GPU, with the stage's time
    limit; the process group is ended on timeout or ``cancel`` (proc.run_process). Logs go to
    ``log_dir`` (kept for the operator)."""

    def __init__(self, log_dir: Path, python: str = sys.executable, timeout_scale: float = 1.0) -> None:
        self.log_dir = Path(log_dir)
        self.python = python
        self.timeout_scale = timeout_scale
        self.children = Children()

    def cancel(self) -> None:
        """Ctrl-C: end every running worker and start no more."""
        self.children.cancel()

    def command(self, spec: StageSpec, job: GpuJob, result: Path) -> list[str]:
        cmd = [self.python, "-m", "kdactl.certify.worker", "--stage", spec.name, "--impl", spec.impl,
               "--gpu", str(job.index), "--target", job.target, "--sku", job.sku, "--result", str(result)]  # fmt: skip
        return cmd + (["--quick"] if job.quick else [])

    def run(self, spec: StageSpec, job: GpuJob) -> list[CheckResult]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"gpu{job.index}-{spec.name}.log"
        limit = spec.timeout_s * self.timeout_scale
        with tempfile.TemporaryDirectory(prefix="kdactl-stage-") as tmp:
            result = Path(tmp) / "result.json"
            env = visible_devices_env(job.env, job.uuid, job.index, job.target, job.sku)
            done = run_process(
                self.command(spec, job, result), env=env, timeout_s=limit, log=log, children=self.children
            )
            if done.start_error:
                return [
                    error(
                        spec.name,
                        "not run: certify was interrupted" if done.start_error == INTERRUPTED else done.start_error,
                    )
                ]
            if done.timed_out:
                return [error(spec.name, f"timed out after {limit:g} s and was killed (hung?); log {log}{_tail(log)}",
                              duration_s=done.duration_s)]  # fmt: skip
            return read_result(spec.name, result, done.returncode, log, done.duration_s)


def read_result(stage: str, result: Path, rc: int | None, log: Path, took: float) -> list[CheckResult]:
    """The worker's results, or one error saying how it died."""
    if rc != 0:
        return [error(stage, f"worker {_how(rc)}; no result; log {log}{_tail(log)}", duration_s=took)]
    try:
        data = json.loads(result.read_text())
        return [CheckResult.from_json(r) for r in data["results"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [
            error(
                stage, f"worker result unreadable ({type(err).__name__}: {err}); log {log}{_tail(log)}", duration_s=took
            )
        ]


def _how(rc: int | None) -> str:
    if rc is None:
        return "never exited"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name} (crashed)"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited {rc}"


def _tail(log: Path) -> str:
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return ""
    if not text:
        return ""
    tail = " | ".join(text[-LOG_TAIL:].splitlines()[-4:])
    return f"; last output: {tail}"


class StderrProgress:
    """One line on stderr as each stage of each GPU starts and ends."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self._write = write or (lambda s: print(s, file=sys.stderr, flush=True))
        self._lock = threading.Lock()

    def started(self, job: GpuJob, stage: str) -> None:
        with self._lock:
            self._write(f"kdactl certify: gpu{job.index} {stage} ...")

    def finished(self, job: GpuJob, stage: str, results: list[CheckResult], seconds: float) -> None:
        counts: dict[str, int] = {}
        for r in results:
            counts[r.status] = counts.get(r.status, 0) + 1
        said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        with self._lock:
            self._write(f"kdactl certify: gpu{job.index} {stage}: {said} ({seconds:.1f} s)")
