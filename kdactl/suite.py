"""Run the validation suite (checks/) on one GPU in a pytest subprocess; its CheckResults come back
through kdactl.suite_plugin (a JSON file), not through a report format.

The suite never passes on missing evidence: a timeout, a crash, a missing or unreadable report, a
run with no tests, or a run where every check skipped (no GPU) is an ``error`` result (inconclusive).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from kdactl.proc import ProcessRunner, ProcResult, run_process
from kdactl.results import CheckResult
from kdactl.suite_plugin import PREFIX

DEFAULT_TIMEOUT_S = 120.0
QUICK_MARKER = "quick"
SUITE_CHECK = PREFIX  # the name of the one result that speaks for the whole run
_MESSAGE_CHARS = 400


def suite_command(checks_dir: Path, results: Path, quick: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", str(checks_dir), "-q", "-p", "no:cacheprovider", "-p", "kdactl.suite_plugin",
           f"--kdactl-results={results}", f"--rootdir={checks_dir}"]  # fmt: skip
    return cmd + (["-m", QUICK_MARKER] if quick else [])


def suite_env(visible: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: one visible GPU (``visible`` is its CUDA_VISIBLE_DEVICES value:
    certify's GPU UUID, or an index when run alone), and this kdactl importable."""
    env = dict(os.environ if base is None else base)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["PYTHONUNBUFFERED"] = "1"
    package_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env


def run_suite(
    gpu: int,
    *,
    quick: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    checks_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    runner: ProcessRunner = run_process,
    visible: str | None = None,
) -> list[CheckResult]:
    """Run checks/ on one GPU within ``timeout_s``; one result per check, labelled ``gpu``. The child
    sees CUDA_VISIBLE_DEVICES=``visible`` (default: the index ``gpu``)."""
    if checks_dir is None:
        from kdactl.assets import checks_dir as default_checks_dir

        checks_dir = default_checks_dir()
    with tempfile.TemporaryDirectory(prefix="kdactl-suite-") as tmp:
        report = Path(tmp) / "results.json"
        proc = runner(suite_command(Path(checks_dir), report, quick), env=suite_env(visible or str(gpu), env),
                      timeout_s=timeout_s, cwd=Path(checks_dir))  # fmt: skip
        text = report.read_text(errors="replace") if report.is_file() else None
    return judge_run(proc, text, gpu, timeout_s)


def judge_run(
    proc: ProcResult, text: str | None, gpu: int | None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[CheckResult]:
    """Pure: the child's outcome and its results file (None when missing) -> results."""

    def whole(message: str) -> list[CheckResult]:
        return [CheckResult(SUITE_CHECK, "error", _clip(message), proc.duration_s, gpu)]

    if proc.start_error:
        return whole(f"cannot start the validation suite: {proc.start_error}")
    if proc.timed_out:
        return whole(f"validation suite timed out after {timeout_s:g} s and was killed (a hung check?); "
                     f"last output: {proc.tail()}")  # fmt: skip
    if text is None:
        return whole(
            f"pytest exited {_rc(proc.returncode)} without a results file (crashed?); last output: {proc.tail()}"
        )
    try:
        results = parse_results(text, gpu)
    except ValueError as err:
        return whole(f"cannot read the suite's results file: {err}")
    return results + _run_problems(results, proc, gpu)


def _run_problems(results: list[CheckResult], proc: ProcResult, gpu: int | None) -> list[CheckResult]:
    """Whole-run errors that the per-check results do not already explain."""
    if not results:
        return [CheckResult(SUITE_CHECK, "error", _clip(f"the suite ran no checks (pytest exit {_rc(proc.returncode)}): "
                                                        f"{proc.tail()}"), proc.duration_s, gpu)]  # fmt: skip
    if all(r.status == "skip" for r in results):
        reasons = sorted({r.message for r in results})
        return [CheckResult(SUITE_CHECK, "error", _clip(f"no check ran, all {len(results)} skipped: {'; '.join(reasons)}"),
                            proc.duration_s, gpu)]  # fmt: skip
    judged = any(r.status in ("fail", "error") for r in results)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not judged):
        return [CheckResult(SUITE_CHECK, "error", _clip(f"pytest exited {_rc(proc.returncode)}: {proc.tail()}"),
                            proc.duration_s, gpu)]  # fmt: skip
    return []


def parse_results(text: str, gpu: int | None = None) -> list[CheckResult]:
    """The plugin's file -> CheckResults for GPU ``gpu`` (ValueError when it is not that file)."""
    try:
        entries = json.loads(text)["results"]
        results = [CheckResult.from_json(e) for e in entries]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"not a kdactl results file: {type(err).__name__}: {err}") from None
    return [replace(r, gpu=gpu, message=_clip(r.message)) for r in results]


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _rc(returncode: int | None) -> str:
    if returncode is None:
        return "(no exit status)"
    return f"{returncode} (killed by signal {-returncode})" if returncode < 0 else str(returncode)
