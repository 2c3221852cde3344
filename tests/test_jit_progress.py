"""kdactl.jit.progress: ninja's status lines parsed, and the progress shown on stderr."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kdactl.jit.progress import (
    BarProgress,
    LineProgress,
    NinjaStep,
    NullProgress,
    make_progress,
    parse_ninja_status,
)


@pytest.mark.parametrize("line, expected", [
    ("[1/7] NVCC library.o\n", NinjaStep(1, 7, "NVCC library.o")),
    ("[7/7] LINK libkdactl.so\r\n", NinjaStep(7, 7, "LINK libkdactl.so")),
    ("[12/130] NVCC kda [chunk].o", NinjaStep(12, 130, "NVCC kda [chunk].o")),
    ("FAILED: selftest.o", None),
    ("selftest.cu(3): error: identifier \"oops\" is undefined", None),
    ("  [1/7] NVCC library.o", None),  # compiler output that merely looks like it
    ("ninja: build stopped: subcommand failed.", None),
    ("", None),
])  # fmt: skip
def test_parse_ninja_status(line, expected):
    assert parse_ninja_status(line) == expected


@pytest.mark.parametrize("as_json, terminal, kind", [
    (False, True, BarProgress), (True, True, BarProgress),  # a terminal's stderr is no document
    (False, False, LineProgress), (True, False, NullProgress),  # --json in a log: nothing but the document
])  # fmt: skip
def test_make_progress(as_json, terminal, kind):
    progress = make_progress(as_json, terminal=terminal)
    assert type(progress) is kind
    progress.close()


def test_line_progress_says_target_step_and_time():
    lines, now = [], iter([100.0, 161.25])
    progress = LineProgress(lines.append, clock=lambda: next(now))
    progress.started("sm_90a", 7)
    progress.step("sm_90a", NinjaStep(3, 7, "NVCC kda_chunk.o"))
    assert lines == ["kdactl build: sm_90a [3/7] NVCC kda_chunk.o (61.2 s)"]


def test_bar_progress_draws_edges_done_of_all_on_a_terminal():
    out = io.StringIO()
    progress = BarProgress(Console(file=out, force_terminal=True, width=120))
    progress.started("sm_90a", 7)
    progress.step("sm_90a", NinjaStep(3, 7, "NVCC kda_chunk.o"))
    progress._bar.refresh()
    progress.finished("sm_90a")
    progress.close()
    text = out.getvalue()
    assert "sm_90a NVCC kda_chunk.o" in text and "3/7" in text and "0:00:0" in text


def test_nothing_built_draws_nothing():
    out = io.StringIO()
    BarProgress(Console(file=out, force_terminal=True)).close()
    assert out.getvalue() == ""
