"""``kdactl sanitize``: the KDA kernels under compute-sanitizer, each tool trusted only after it
caught its planted fault.

For each tool (memcheck, synccheck, racecheck, initcheck), at once: the positive control
(checks/control.py runs the tool's fault from csrc/faults/) and the payload (checks/payload.py, a
smoke of every eligible route and the self-test), each in a subprocess with a time limit, the
caching allocator off, an explicit --error-exitcode and --target-processes all. Verdict per tool:

  control not caught (or not run)                   -> error: the sanitizer is not trusted
  payload: the tool reports errors, or a wrong result -> fail
  payload: parse_output passes and the sentinel is there -> pass
  anything else (killed, timeout, no summary, app failed, no sentinel) -> error
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdactl.errors import KdactlError, ToolMissing
from kdactl.proc import ProcessRunner, ProcResult, run_process
from kdactl.results import CheckResult
from kdactl.sanitizer.faultlib import CONTROL_FOR_TOOL
from kdactl.sanitizer.parse import TOOLS, parse_output
from kdactl.settings import Settings
from kdactl.suite import suite_env

ERROR_EXITCODE = 99
DEFAULT_TIMEOUT_S = 300.0  # per compute-sanitizer run
CONTROL_TIMEOUT_S = 120.0
TOOL_ARGS: dict[str, tuple[str, ...]] = {}  # extra options per tool (none needed: defaults report errors)
SENTINEL = re.compile(r"^KDACTL-PAYLOAD-OK routes=(\S*) kernels=(\d+)\s*$", re.M)
PAYLOAD_FAIL = re.compile(r"^KDACTL-PAYLOAD-FAIL (.*)$", re.M)
PAYLOAD_ERROR = re.compile(r"^KDACTL-PAYLOAD-ERROR (.*)$", re.M)


@dataclass(frozen=True)
class Prepared:
    """Built before any sanitizer run, so that no compiler runs under instrumentation."""

    target: str
    faults_lib: Path


@dataclass(frozen=True)
class ToolRun:
    tool: str
    status: str  # pass | fail | error
    message: str
    duration_s: float
    details: dict[str, Any] = field(default_factory=dict)  # control / payload facts for --json

    def result(self, gpu: int | None) -> CheckResult:
        return CheckResult(f"sanitize.{self.tool}", self.status, self.message, round(self.duration_s, 3), gpu)


def find_sanitizer(settings: Settings) -> str:
    """compute-sanitizer: KDACTL_COMPUTE_SANITIZER, PATH, or the toolkit next to nvcc."""
    named = settings.env.get("KDACTL_COMPUTE_SANITIZER")
    if named:
        if shutil.which(named):
            return str(shutil.which(named))
        raise ToolMissing(f"KDACTL_COMPUTE_SANITIZER={named} is not an executable")
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    nvcc = shutil.which(settings.nvcc)
    roots = [Path(nvcc).resolve().parent.parent] if nvcc else []
    for root in [*roots, Path("/usr/local/cuda")]:
        for candidate in (root / "bin" / "compute-sanitizer", root / "compute-sanitizer" / "compute-sanitizer"):
            if candidate.is_file():
                return str(candidate)
    raise ToolMissing("compute-sanitizer not found (looked on PATH and next to nvcc; set KDACTL_COMPUTE_SANITIZER)")


def prepare_libraries(settings: Settings) -> Prepared:
    """Build or load the kernel library and the positive-control library for this node's target."""
    from kdactl.jit.library import load_kernels
    from kdactl.sanitizer.faultlib import build_faults

    kernels = load_kernels(settings)
    return Prepared(kernels.target, build_faults(settings, kernels.target))


def sanitizer_command(exe: str, tool: str, script: Path, args: Sequence[str] = ()) -> list[str]:
    return [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--target-processes", "all",
            *TOOL_ARGS.get(tool, ()), sys.executable, str(script), *args]  # fmt: skip


def sanitizer_env(visible: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = suite_env(visible, base)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"  # every tensor its own allocation: memcheck sees overruns
    return env


def judge_control(tool: str, proc: ProcResult) -> tuple[bool, dict[str, Any]]:
    """Did the tool catch its planted fault? (pure)"""
    fault = CONTROL_FOR_TOOL[tool]
    detail: dict[str, Any] = {"fault": fault, "duration_s": round(proc.duration_s, 3)}
    if proc.start_error or proc.timed_out:
        detail["reason"] = proc.start_error or f"timed out after {proc.duration_s:.0f} s"
        return False, {**detail, "caught": False, "errors": None}
    res = parse_output(proc.output, _rc(proc), tool=tool)
    launched = f"fault={fault} launched=1" in proc.output
    caught = launched and bool(res.errors) and res.tool == tool
    reason = res.reason if launched else f"the planted fault did not launch ({proc.tail(300)})"
    return caught, {**detail, "caught": caught, "errors": res.errors, "reason": reason}


def judge_payload(tool: str, proc: ProcResult, timeout_s: float) -> tuple[str, str, dict[str, Any]]:
    """(status, message, details) of one payload run (pure)."""
    detail: dict[str, Any] = {"duration_s": round(proc.duration_s, 3), "returncode": proc.returncode}
    if proc.start_error:
        return "error", f"{tool}: cannot run the payload: {proc.start_error}", detail
    if proc.timed_out:
        return (
            "error",
            f"{tool}: payload killed after the {timeout_s:g} s time limit; last output: {proc.tail(300)}",
            detail,
        )
    res = parse_output(proc.output, _rc(proc), tool=tool)
    sentinel, failed = SENTINEL.search(proc.output), PAYLOAD_FAIL.search(proc.output)
    detail.update(errors=res.errors, reason=res.reason, sentinel=bool(sentinel))
    if sentinel:
        detail.update(routes=sentinel.group(1).split(","), kernels=int(sentinel.group(2)))
    if res.errors:
        return "fail", res.reason, detail
    if failed:
        return "fail", f"{tool}: payload result wrong: {failed.group(1)[:300]}", detail
    if res.passed and sentinel:
        return "pass", f"{res.reason}; routes={sentinel.group(1)} kernels={sentinel.group(2)}", detail
    if res.passed:
        return (
            "error",
            f"{tool}: 0 errors but the payload's sentinel is missing: its kernels are not proven to have run",
            detail,
        )
    payload_error = PAYLOAD_ERROR.search(proc.output)
    why = f"; payload: {payload_error.group(1)[:300]}" if payload_error else ""
    return "error", f"{res.reason}{why}", detail


def run_tool(tool: str, exe: str, prepared: Prepared, checks: Path, visible: str, timeout_s: float,
             runner: ProcessRunner, base_env: Mapping[str, str] | None = None) -> ToolRun:  # fmt: skip
    """The positive control and the payload under one tool, at once (two processes), on the GPU
    CUDA_VISIBLE_DEVICES=``visible``; the payload's verdict counts only if the control was caught."""
    env = sanitizer_env(visible, base_env)
    fault = CONTROL_FOR_TOOL[tool]
    control_cmd = sanitizer_command(
        exe, tool, checks / "control.py", ["--lib", str(prepared.faults_lib), "--fault", fault]
    )
    payload_cmd = sanitizer_command(exe, tool, checks / "payload.py", ["--faults-lib", str(prepared.faults_lib)])
    with ThreadPoolExecutor(max_workers=1) as pool:
        payload_run = pool.submit(runner, payload_cmd, env=env, timeout_s=timeout_s, cwd=checks)
        control = runner(control_cmd, env=env, timeout_s=min(timeout_s, CONTROL_TIMEOUT_S), cwd=checks)
        payload = payload_run.result()
    caught, control_detail = judge_control(tool, control)
    duration = max(control.duration_s, payload.duration_s)
    if not caught:
        message = (
            f"{tool}: sanitizer not trusted: it did not catch the planted {fault} fault ({control_detail['reason']})"
        )
        return ToolRun(tool, "error", message, duration, {"control": control_detail, "payload": None})
    status, message, payload_detail = judge_payload(tool, payload, timeout_s)
    message = f"{message}; control {fault}: caught ({control_detail['errors']} errors)"
    return ToolRun(tool, status, message, duration, {"control": control_detail, "payload": payload_detail})


def sanitize_tools(
    settings: Settings,
    *,
    tools: Sequence[str] = TOOLS,
    gpu: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    runner: ProcessRunner = run_process,
    prepare: Callable[[Settings], Prepared] = prepare_libraries,
    find: Callable[[Settings], str] = find_sanitizer,
    checks_dir: Path | None = None,
    visible: str | None = None,
) -> list[ToolRun]:
    """Every requested tool's run on GPU ``gpu`` (CUDA_VISIBLE_DEVICES=``visible``, default the index);
    a missing sanitizer, GPU or library makes every tool an error."""
    try:
        exe = find(settings)
        prepared = prepare(settings)
        if checks_dir is None:
            from kdactl.assets import checks_dir as default_checks_dir

            checks_dir = default_checks_dir()
    except KdactlError as err:
        return [ToolRun(tool, "error", f"{tool}: not run: {err}", 0.0) for tool in tools]
    except Exception as err:  # noqa: BLE001 - a result with the reason, for certify, never a traceback
        return [ToolRun(tool, "error", f"{tool}: not run: {type(err).__name__}: {err}", 0.0) for tool in tools]
    # The tools run at once, each in its own subprocess: certify's time is the slowest tool's, not the sum.
    with ThreadPoolExecutor(max_workers=max(1, len(tools))) as pool:
        return list(pool.map(lambda t: run_tool(t, exe, prepared, Path(checks_dir), visible or str(gpu), timeout_s, runner,
                                                settings.env or None), tools))  # fmt: skip


def run_sanitizers(settings: Settings, *, tools: Sequence[str] = TOOLS, gpu: int = 0,
                   timeout_s: float = DEFAULT_TIMEOUT_S, runner: ProcessRunner = run_process,
                   **kwargs: Any) -> list[CheckResult]:  # fmt: skip
    """For certify: one CheckResult ``sanitize.<tool>`` per tool, on GPU ``gpu``."""
    runs = sanitize_tools(settings, tools=tools, gpu=gpu, timeout_s=timeout_s, runner=runner, **kwargs)
    return [run.result(gpu) for run in runs]


def _rc(proc: ProcResult) -> int:
    return -9 if proc.returncode is None else proc.returncode


# ---------------------------------------------------------------------------------------------
# kdactl sanitize: options, report, exit code


def parse_tools(text: str | None) -> tuple[str, ...]:
    """'memcheck,racecheck' -> tools in order, without duplicates; UsageError names a bad one."""
    from kdactl.errors import UsageError

    names = [n.strip() for n in (text or ",".join(TOOLS)).split(",") if n.strip()]
    bad = [n for n in names if n not in TOOLS]
    if bad or not names:
        raise UsageError(f"--tool takes a comma list of {', '.join(TOOLS)}; got {text!r}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class SanitizeReport:
    gpu: int
    runs: tuple[ToolRun, ...]

    @property
    def results(self) -> list[CheckResult]:
        return [run.result(self.gpu) for run in self.runs]

    @property
    def verdict(self) -> tuple[str, str]:
        from kdactl.results import verdict

        return verdict(self.results)

    @property
    def exit_code(self) -> int:
        from kdactl.results import VERDICT_EXIT

        return VERDICT_EXIT[self.verdict[0]]

    def to_json(self) -> dict[str, Any]:
        name, reason = self.verdict
        return {
            "command": "sanitize",
            "gpu": self.gpu,
            "verdict": name,
            "reason": reason,
            "exit_code": self.exit_code,
            "results": [r.to_json() for r in self.results],
            "tools": {run.tool: run.details for run in self.runs},
        }

    def render(self, console: Any) -> None:
        for run in self.runs:
            console.print(
                f"{run.tool:<10} {run.status.upper():<5} {run.duration_s:6.1f} s  {run.message}", markup=False
            )
        name, reason = self.verdict
        console.print(f"sanitize gpu {self.gpu}: {name} ({reason})", markup=False)


def sanitize_command(settings: Settings, *, tools: str | None = None, gpu: int = 0,
                     timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> SanitizeReport:  # fmt: skip
    """``kdactl sanitize``: the runs as a Report (exit 0 all pass, 1 any fail, 3 any error)."""
    from kdactl.errors import UsageError
    from kdactl.faults import fault_from_env

    chosen = parse_tools(tools)
    fault_from_env(settings.env)
    if gpu < 0:
        raise UsageError(f"--gpu must be a GPU index >= 0, got {gpu}")
    if timeout_s <= 0:
        raise UsageError(f"--timeout must be positive seconds, got {timeout_s:g}")
    runs = sanitize_tools(settings, tools=chosen, gpu=gpu, timeout_s=timeout_s, **kwargs)
    return SanitizeReport(gpu, tuple(runs))
