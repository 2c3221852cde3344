"""The stdout emitter: how a command's result leaves the process, as one JSON document on stdout
or as rich text (the results themselves, each command's "report", live with their commands)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # rich is imported when something is printed: kdactl gate's start-up stays small
    from rich.console import Console
    from rich.progress import Progress

    from kdactl.settings import Settings


class Report(Protocol):
    @property
    def exit_code(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...

    def render(self, console: Console) -> None: ...


def stdout_console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


class PlainConsole:
    """The part of rich's Console that a plain report uses (print, markup off), written straight to
    stdout: kdactl gate answers every few minutes on every node, and importing rich for its one line
    cost about 30 ms of its start-up on an H200 node."""

    def print(self, *objects: Any, markup: bool = False, **_: Any) -> None:
        sys.stdout.write(" ".join(str(o) for o in objects) + "\n")


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def stderr_progress_bar(console: Console | None = None) -> Progress:
    """A rich progress display on stderr (description, bar, done of all, elapsed time), gone once
    stopped; it leaves stdout alone, where a --json document must stay whole."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console or stderr_console(), transient=True, redirect_stdout=False)  # fmt: skip


def emit(report: Report, as_json: bool, console: Callable[[], Any] = stdout_console) -> None:
    if as_json:  # the whole document first: an error while building it must not leave half of one on stdout
        text = json.dumps(report.to_json(), indent=2, sort_keys=False, default=str)
        sys.stdout.write(text + "\n")
    else:
        report.render(console())


def one_line(message: str) -> str:
    return " | ".join(ln.strip() for ln in str(message).splitlines() if ln.strip()) or "no message"


def emit_error(message: str, exit_code: int, as_json: bool, command: str | None = None) -> None:
    """One line on stderr; under --json the one stdout document says the same."""
    line = one_line(message)
    stderr_console().print(f"kdactl: {line}", markup=False)
    if as_json:
        sys.stdout.write(json.dumps({"command": command, "exit_code": exit_code, "error": line}) + "\n")


def run_report(
    action: Callable[[Settings], Report],
    as_json: bool,
    command: str | None,
    console: Callable[[], Any] = stdout_console,
) -> int:
    """Run a command body and render its result (on ``console()``); map the result, or any error on
    the way (rendering included), to the SPEC exit code, which it returns."""
    from kdactl.errors import EXIT_INCONCLUSIVE, KdactlError
    from kdactl.settings import Settings

    try:
        report = action(Settings.from_env())
        emit(report, as_json, console)
        return report.exit_code
    except KdactlError as err:
        code = err.exit_code
        emit_error(str(err), code, as_json, command)
    except KeyboardInterrupt:  # Ctrl-C: nothing was judged (certify keeps the old certificate)
        code = EXIT_INCONCLUSIVE
        emit_error("interrupted", code, as_json, command)
    except Exception as err:  # noqa: BLE001 - SPEC: any exception ends as 3 with one line
        code = EXIT_INCONCLUSIVE
        emit_error(f"internal error: {type(err).__name__}: {err}", code, as_json, command)
    return code
