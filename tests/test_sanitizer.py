"""kdactl.sanitizer.parse_output over recorded compute-sanitizer output (CPU only).

Files in tests/data/sanitizer/ without a ``synthetic_`` prefix are real output of compute-sanitizer
2025.3.1 (CUDA 13) on an H200, stdout and stderr together, recorded from a small payload with one
planted fault per mode (out-of-bounds write, divergent __syncthreads, shared-memory race,
uninitialised read, failed API call, leak, exit(1), SIGSEGV, abort, killed). The return code each run
gave is written next to its file in CASES. ``synthetic_`` files are built by hand (an internal
sanitizer error, a failed attach) or by concatenating two real logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kdactl.sanitizer import SanitizerResult, detect_tool, parse_output

DATA = Path(__file__).parent / "data" / "sanitizer"


def read(name: str) -> str:
    return (DATA / f"{name}.txt").read_text()


# fixture, returncode, tool hint, expected tool, errors, passed, words the reason must contain
CASES = [
    ("memcheck_clean", 0, "memcheck", "memcheck", 0, True, "memcheck: 0 errors"),
    ("synccheck_clean", 0, "synccheck", "synccheck", 0, True, "synccheck: 0 errors"),
    ("racecheck_clean", 0, None, "racecheck", 0, True, "racecheck: 0 errors"),
    ("initcheck_clean", 0, "initcheck", "initcheck", 0, True, "initcheck: 0 errors"),
    ("memcheck_oob", 2, None, "memcheck", 67, False, "memcheck: 67 errors"),
    ("memcheck_apierr", 0, "memcheck", "memcheck", 1, False, "memcheck: 1 error;"),
    ("memcheck_leak", 0, None, "memcheck", 2, False, "memcheck: 2 errors"),
    ("memcheck_two_processes", 2, None, "memcheck", 134, False, "memcheck: 134 errors"),
    ("synccheck_barrier", 2, None, "synccheck", 32, False, "synccheck: 32 errors"),
    ("racecheck_race", 0, None, "racecheck", 1, False, "racecheck: 1 error"),
    ("racecheck_race_hazard_report", 0, None, "racecheck", 256, False, "racecheck: 256 errors"),
    ("racecheck_waw", 0, "racecheck", "racecheck", 1, False, "racecheck: 1 error"),
    ("initcheck_uninit", 0, None, "initcheck", 64, False, "initcheck: 64 errors"),
    # The application failed but the sanitizer found nothing: must not pass.
    ("memcheck_appfail", 1, "memcheck", "memcheck", 0, False,
     "application failed although summary says 0 errors: Target application returned an error"),
    ("initcheck_appfail", 1, "initcheck", "initcheck", 0, False, "application failed although"),
    ("memcheck_segv", 11, "memcheck", "memcheck", 0, False,
     "0 errors: Error: process didn't terminate successfully; Target application returned an error"),
    ("initcheck_abort", 6, "initcheck", "initcheck", 0, False,
     "Error: process didn't terminate successfully"),
    ("synthetic_internal_error", 0, "memcheck", "memcheck", 0, False, "Internal Sanitizer Error"),
    # No summary line at all.
    ("memcheck_nocuda", 255, "memcheck", "memcheck", None, False,
     "no ERROR SUMMARY line found (returncode 255); Error: Target application terminated before"),
    ("synccheck_noattach", 255, "synccheck", "synccheck", None, False, "no ERROR SUMMARY line"),
    ("memcheck_noapp", 1, "memcheck", "memcheck", None, False, "Target application doesn't exist"),
    ("synthetic_noattach", 1, "racecheck", "racecheck", None, False,
     "no RACECHECK SUMMARY line found (returncode 1); Error: No attachable process found"),
    ("memcheck_killed", 137, "memcheck", "memcheck", None, False,
     "run killed (SIGKILL, returncode 137), output truncated"),
    # Warnings alone pass (SPEC: zero errors), but the reason names them.
    ("racecheck_warnings_only", 0, None, "racecheck", 0, True, "racecheck: 0 errors, 1 warning (not failing)"),
    # Two logs in one text: summed, and the reason says so.
    ("synthetic_memcheck_two_logs_clean", 0, "memcheck", "memcheck", 0, True,
     "summed over 2 summary lines"),
    ("synthetic_memcheck_two_logs_one_error", 0, "memcheck", "memcheck", 1, False,
     "memcheck: 1 error (summed over 2 summary lines)"),
]


@pytest.mark.parametrize(
    ("name", "rc", "hint", "tool", "errors", "passed", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_recorded_output(name, rc, hint, tool, errors, passed, reason):
    result = parse_output(read(name), rc, tool=hint)
    assert isinstance(result, SanitizerResult)
    assert (result.tool, result.errors, result.passed) == (tool, errors, passed), result.reason
    assert reason in result.reason
    assert result.returncode == rc


def test_spec_signature_two_positional_args():
    result = parse_output(read("racecheck_clean"), 0)
    assert result.passed and result.tool == "racecheck" and result.errors == 0


def test_clean_output_names_no_tool_without_hint():
    result = parse_output(read("memcheck_clean"), 0)
    assert result.tool == "unknown" and result.errors == 0 and result.passed
    assert result.reason == "compute-sanitizer: 0 errors"


@pytest.mark.parametrize(
    ("name", "rc"),
    [("memcheck_clean", 1), ("racecheck_clean", 2), ("initcheck_clean", 86), ("synccheck_clean", 255)],
    ids=["memcheck-rc1", "racecheck-rc2", "initcheck-rc86", "synccheck-rc255"],
)
def test_nonzero_returncode_with_zero_errors_fails(name, rc):
    result = parse_output(read(name), rc)
    assert result.errors == 0 and not result.passed
    assert f"returncode {rc} although summary says 0 errors" in result.reason


@pytest.mark.parametrize("rc", [-9, 137, -15, 143], ids=["minus9", "137", "minus15", "143"])
def test_killed_with_truncated_output(rc):
    text = "\n".join(read("memcheck_oob").splitlines()[:20])  # cut mid error block
    result = parse_output(text, rc, tool="memcheck")
    assert result.errors is None and not result.passed
    assert "run killed" in result.reason and "output truncated" in result.reason


def test_killed_after_summary_still_fails():
    result = parse_output(read("memcheck_clean"), -9, tool="memcheck")
    assert result.errors == 0 and not result.passed
    assert result.reason == "memcheck: run killed (SIGKILL, returncode -9)"


@pytest.mark.parametrize("text", ["", "   \n", None], ids=["empty", "blank", "none"])
def test_empty_output(text):
    result = parse_output(text, 0, tool="initcheck")
    assert result.errors is None and not result.passed
    assert result.reason == "initcheck: empty output (returncode 0)"


def test_errors_win_over_exit_code_and_banner_recorded():
    # --error-exitcode was not given, so racecheck exits 0 although it found a race.
    result = parse_output(read("racecheck_race"), 0)
    assert result.hazards == 1 and result.warnings == 0 and not result.passed
    assert result.banner


def test_racecheck_counts():
    result = parse_output(read("racecheck_race_hazard_report"), 0)
    assert (result.hazards, result.errors, result.warnings) == (100, 256, 0)


def test_error_summary_note_line_is_not_a_second_summary():
    text = read("memcheck_two_processes")
    assert "ERROR SUMMARY: 34 errors were not printed" in text
    result = parse_output(text, 2)
    assert result.summaries == 1 and result.errors == 134


def test_singular_error():
    text = read("memcheck_apierr")
    assert "ERROR SUMMARY: 1 error\n" in text
    result = parse_output(text, 0, tool="memcheck")
    assert result.errors == 1 and result.reason.startswith("memcheck: 1 error;")
    assert result.app_failures[0].startswith("Program hit cudaErrorInvalidValue (error 1)")


def test_api_error_alone_does_not_name_the_tool():
    # Any tool can report failed API calls, so "Program hit ..." is no evidence of memcheck.
    result = parse_output(read("memcheck_apierr"), 0)
    assert result.tool == "unknown" and result.errors == 1 and not result.passed
    assert result.reason.startswith("compute-sanitizer: 1 error;")


def test_repeated_failure_lines_are_listed_once():
    result = parse_output(read("memcheck_oob"), 2)
    hits = [f for f in result.app_failures if "cudaFree" in f]
    assert len(hits) == 1
    assert "Target application returned an error" in result.app_failures


def test_hint_that_contradicts_the_output_fails():
    result = parse_output(read("racecheck_clean"), 0, tool="memcheck")
    assert result.tool == "racecheck" and not result.passed
    assert result.reason == "expected memcheck but the output is from racecheck"


def test_racecheck_hint_on_error_summary_output_fails():
    result = parse_output(read("memcheck_clean"), 0, tool="racecheck")
    assert result.errors is None and not result.passed
    assert "racecheck: no RACECHECK SUMMARY line found" in result.reason


def test_echoed_tool_option_names_the_tool():
    text = "$ compute-sanitizer --tool=synccheck ./payload\n" + read("synccheck_clean")
    assert parse_output(text, 0).tool == "synccheck"


@pytest.mark.parametrize(
    ("name", "tool"),
    [
        ("memcheck_oob", "memcheck"),
        ("memcheck_leak", "memcheck"),
        ("synccheck_barrier", "synccheck"),
        ("initcheck_uninit", "initcheck"),
        ("racecheck_race", "racecheck"),
        ("memcheck_clean", "unknown"),
    ],
    ids=["oob", "leak", "barrier", "uninit", "race", "clean"],
)
def test_detect_tool_from_error_reports(name, tool):
    assert detect_tool(read(name)) == tool


def test_detect_tool_from_warp_level_hazard_line():
    line = "========= Warning: (Warp Level Programming) Potential RAW hazard detected at __shared__ 0x47c\n"
    assert detect_tool(line) == "racecheck"


def test_bad_tool_hint_is_a_value_error():
    with pytest.raises(ValueError, match="tool must be one of .* got 'cuda-memcheck'"):
        parse_output("", 0, tool="cuda-memcheck")


def test_result_is_frozen():
    result = parse_output(read("memcheck_clean"), 0)
    with pytest.raises(AttributeError):
        result.passed = False  # type: ignore[misc]
