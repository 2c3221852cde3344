"""Judge compute-sanitizer output: a pure parser and verdict, no subprocess.

``parse_output(text, returncode)`` reads what compute-sanitizer printed (stdout and stderr together)
and decides. It passes only when every one of these holds:

- a summary line was found (``ERROR SUMMARY: N errors`` for memcheck, synccheck and initcheck;
  ``RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)`` for racecheck) and the errors
  add up to zero;
- nothing reports a failed application (``Target application returned an error``, ``Program hit
  cudaError...``, ``Error: process didn't terminate successfully``, an internal sanitizer error, ...);
- the return code is 0. A negative code or 129..254 is reported as a kill by a signal (a shell or
  ``timeout`` killed the run). compute-sanitizer itself exits with the application's code: the
  signal number for a crash (11 for SIGSEGV, 6 for abort), 255 when it could not run the target.

Decisions worth knowing:

- Racecheck *warnings* alone do not fail the run (SPEC: pass on zero errors); they are counted in
  ``.warnings`` and named in the reason.
- compute-sanitizer prints one summary for the whole process tree, but should several appear (output
  of several runs concatenated), their errors are summed and the reason says how many were found.
- The trailing ``ERROR SUMMARY: N errors were not printed`` line is a note, not a second summary.
- memcheck, synccheck and initcheck print the same banner and summary, so a clean run names no tool.
  The tool is taken from, in order: the racecheck summary, an echoed ``--tool X``, the kind of error
  reports in the text, then the caller's ``tool=`` hint. If the text clearly shows a different tool
  than the caller expected, the run does not pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOLS = ("memcheck", "synccheck", "racecheck", "initcheck")
UNKNOWN = "unknown"

_PREFIX = r"^=+\s*"
_ERROR_SUMMARY = re.compile(_PREFIX + r"ERROR SUMMARY: (\d+) errors?\s*$", re.M)
_RACE_SUMMARY = re.compile(
    _PREFIX + r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)\s*$",
    re.M,
)
_BANNER = re.compile(_PREFIX + r"COMPUTE-SANITIZER\s*$", re.M)
_TOOL_OPTION = re.compile(r"--tool[= ]+(memcheck|synccheck|racecheck|initcheck)\b")

# Error reports that only one tool prints.
_TOOL_MARKERS = (
    ("racecheck", re.compile(_PREFIX + r"(Error|Warning|Info): (\(.*?\) )?(Race reported|Potential \w+ hazard)", re.M)),
    ("synccheck", re.compile(_PREFIX + r"(Barrier error detected|Invalid arguments)", re.M)),
    ("initcheck", re.compile(_PREFIX + r"Uninitialized __\w+__ memory read", re.M)),
    ("memcheck", re.compile(_PREFIX + r"(Invalid __\w+__ (read|write|atomic)|Leaked \d+ bytes|Malloc/Free)", re.M)),
)

# Lines that say the application (or the sanitizer around it) did not finish normally.
_APP_FAILURES = (
    re.compile(_PREFIX + r"Target application returned an error.*$", re.M),
    re.compile(_PREFIX + r"Error: process didn't terminate successfully.*$", re.M),
    re.compile(_PREFIX + r"Error: Target application terminated before first instrumented API call.*$", re.M),
    re.compile(_PREFIX + r"Target application doesn't exist or is not a valid executable.*$", re.M),
    re.compile(_PREFIX + r"Error: No attachable process found.*$", re.M),
    re.compile(_PREFIX + r"Internal Sanitizer Error.*$", re.M),
    re.compile(_PREFIX + r"Program hit cudaError\w+.*$", re.M),
)


@dataclass(frozen=True)
class SanitizerResult:
    """What one compute-sanitizer run showed, and whether it passes."""

    tool: str
    errors: int | None
    passed: bool
    reason: str
    returncode: int
    summaries: int = 0
    hazards: int | None = None
    warnings: int | None = None
    app_failures: tuple[str, ...] = ()
    banner: bool = False


@dataclass(frozen=True)
class _Summary:
    count: int
    errors: int | None
    hazards: int | None
    warnings: int | None


def parse_output(text: str, returncode: int, *, tool: str | None = None) -> SanitizerResult:
    """Parse compute-sanitizer's output and judge it; ``tool`` is the caller's expected tool, if any."""
    if tool is not None and tool not in TOOLS:
        raise ValueError(f"tool must be one of {', '.join(TOOLS)}, got {tool!r}")
    text = text or ""
    seen = detect_tool(text)
    name = seen if seen != UNKNOWN else (tool or UNKNOWN)
    summary = _read_summary(text, name)
    failures = _app_failures(text)
    reason, passed = _verdict(name, summary, failures, returncode, text)
    if passed and tool is not None and seen not in (UNKNOWN, tool):
        reason, passed = f"expected {tool} but the output is from {seen}", False
    return SanitizerResult(
        tool=name,
        errors=summary.errors,
        passed=passed,
        reason=reason,
        returncode=returncode,
        summaries=summary.count,
        hazards=summary.hazards,
        warnings=summary.warnings,
        app_failures=failures,
        banner=bool(_BANNER.search(text)),
    )


def detect_tool(text: str) -> str:
    """The tool the text itself shows, or ``"unknown"`` (clean memcheck/synccheck/initcheck look alike)."""
    if _RACE_SUMMARY.search(text):
        return "racecheck"
    option = _TOOL_OPTION.search(text)
    if option:
        return option.group(1)
    for name, marker in _TOOL_MARKERS:
        if marker.search(text):
            return name
    return UNKNOWN


def _app_failures(text: str) -> tuple[str, ...]:
    """Failure lines in the order printed, each once (``Program hit ...`` repeats per call)."""
    found = sorted((m.start(), m.group(0).lstrip("= ").strip()) for rx in _APP_FAILURES for m in rx.finditer(text))
    return tuple(dict.fromkeys(line for _, line in found))


def _read_summary(text: str, tool: str) -> _Summary:
    """Sum every summary line of the tool's kind; ``errors`` is None when there is none."""
    if tool == "racecheck":
        found = [tuple(int(g) for g in m.groups()) for m in _RACE_SUMMARY.finditer(text)]
        if not found:
            return _Summary(0, None, None, None)
        return _Summary(
            count=len(found),
            errors=sum(f[1] for f in found),
            hazards=sum(f[0] for f in found),
            warnings=sum(f[2] for f in found),
        )
    found_errors = [int(m.group(1)) for m in _ERROR_SUMMARY.finditer(text)]
    if not found_errors:
        return _Summary(0, None, None, None)
    return _Summary(len(found_errors), sum(found_errors), None, None)


def _verdict(tool: str, summary: _Summary, failures: tuple[str, ...], returncode: int, text: str) -> tuple[str, bool]:
    """The reason and the pass/fail, most serious finding first."""
    label = tool if tool != UNKNOWN else "compute-sanitizer"
    if summary.errors:
        noun = "error" if summary.errors == 1 else "errors"
        extra = f"; also: {failures[0]}" if failures else ""
        return f"{label}: {summary.errors} {noun}{_summaries_note(summary)}{extra}", False
    signal = _signal(returncode)
    if signal:
        tail = "" if summary.errors is not None else ", output truncated (no summary line)"
        return f"{label}: run killed ({signal}, returncode {returncode}){tail}", False
    if summary.errors is None:
        return _missing_summary(label, tool, failures, returncode, text), False
    if failures:
        return f"{label}: application failed although summary says 0 errors: {'; '.join(failures)}", False
    if returncode != 0:
        return f"{label}: returncode {returncode} although summary says 0 errors", False
    warn = (
        f", {summary.warnings} warning{'s' if summary.warnings > 1 else ''} (not failing)" if summary.warnings else ""
    )
    return f"{label}: 0 errors{warn}{_summaries_note(summary)}", True


def _missing_summary(label: str, tool: str, failures: tuple[str, ...], returncode: int, text: str) -> str:
    """Reason for output without a summary line."""
    line = "RACECHECK SUMMARY" if tool == "racecheck" else "ERROR SUMMARY"
    if not text.strip():
        return f"{label}: empty output (returncode {returncode})"
    why = f"; {failures[0]}" if failures else ""
    return f"{label}: no {line} line found (returncode {returncode}){why}"


def _summaries_note(summary: _Summary) -> str:
    return f" (summed over {summary.count} summary lines)" if summary.count > 1 else ""


def _signal(returncode: int) -> str | None:
    """Name the signal when the return code says the run was killed, else None."""
    if returncode < 0:
        number = -returncode
    elif returncode > 128 and returncode != 255:
        number = returncode - 128
    else:
        return None
    names = {2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
    return names.get(number, f"signal {number}")
