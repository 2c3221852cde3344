"""Progress on stderr: a rich progress bar on a terminal, plain log lines otherwise, silence under
--json (the one JSON document on stdout is the whole answer)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Protocol

log = logging.getLogger("kdactl.bench")

if TYPE_CHECKING:
    from rich.progress import TaskID


class Progress(Protocol):
    def start(self, total: int) -> None: ...

    def phase(self, text: str) -> None: ...

    def advance(self) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    def start(self, total: int) -> None:
        pass

    def phase(self, text: str) -> None:
        log.debug("%s", text)

    def advance(self) -> None:
        pass

    def close(self) -> None:
        pass


class LineProgress(NullProgress):
    """Not a terminal (a log file, CI): one line per phase on stderr."""

    def __init__(self):
        self._handler = _stderr_handler()

    def phase(self, text: str) -> None:
        log.info("%s", text)

    def close(self) -> None:
        _drop_handler(self._handler)


class BarProgress:
    """A terminal: one bar over the shapes, its description the current phase."""

    def __init__(self):
        from kdactl.emit import stderr_progress_bar

        self._bar = stderr_progress_bar()
        self._task: TaskID | None = None  # the bar, once start() has sized it
        self._handler = _stderr_handler()

    def start(self, total: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task("bench", total=total)

    def phase(self, text: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, description=text)

    def advance(self) -> None:
        if self._task is not None:
            self._bar.advance(self._task)

    def close(self) -> None:
        self._bar.stop()
        _drop_handler(self._handler)


def _stderr_handler():
    """Route kdactl.bench INFO lines (device, timer, warnings) to stderr for this run only."""
    if log.handlers:
        return None
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("kdactl bench: %(message)s"))
    log.addHandler(h)
    log.setLevel(logging.INFO)
    return h


def _drop_handler(h) -> None:
    if h is not None:
        log.removeHandler(h)


def make_progress(as_json: bool) -> NullProgress | LineProgress | BarProgress:
    if as_json:
        return NullProgress()
    return BarProgress() if sys.stderr.isatty() else LineProgress()
