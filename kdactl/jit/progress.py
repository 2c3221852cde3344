"""Build progress from ninja's own count: its status line as each edge (a compile or the link)
finishes, parsed here; shown on stderr as a rich bar per target on a terminal, as one line per
edge in a log, and not at all under --json unless stderr is a terminal (stdout holds the one JSON
document either way)."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

# Set for every build, so that an operator's own NINJA_STATUS cannot change what is parsed; ninja
# prints it when an edge finishes when its output is not a terminal: %f edges finished, %t in all.
NINJA_STATUS = "[%f/%t] "
_STATUS = re.compile(r"\[(\d+)/(\d+)\] (.*)")


@dataclass(frozen=True)
class NinjaStep:
    done: int  # edges finished, this one included
    total: int  # edges this build runs
    what: str  # the edge's description: "NVCC library.o", "LINK libkdactl.so"


def parse_ninja_status(line: str) -> NinjaStep | None:
    """The step a ninja status line reports; None for any other line (compiler output, errors)."""
    m = _STATUS.fullmatch(line.rstrip("\r\n"))
    return NinjaStep(int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


class BuildProgress(Protocol):
    def started(self, target: str, edges: int) -> None: ...

    def step(self, target: str, step: NinjaStep) -> None: ...

    def finished(self, target: str) -> None: ...


class NullProgress:
    def started(self, target: str, edges: int) -> None:
        pass

    def step(self, target: str, step: NinjaStep) -> None:
        pass

    def finished(self, target: str) -> None:
        pass

    def close(self) -> None:
        pass


class LineProgress(NullProgress):
    """Not a terminal (a log, a journal): one stderr line per finished edge, with the time since
    the target's build started."""

    def __init__(self, write: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write or (lambda s: print(s, file=sys.stderr, flush=True))
        self._clock = clock
        self._start: dict[str, float] = {}
        self._lock = threading.Lock()  # ninja's output is read on a thread of its own

    def started(self, target: str, edges: int) -> None:
        self._start[target] = self._clock()

    def step(self, target: str, step: NinjaStep) -> None:
        now = self._clock()
        took = now - self._start.get(target, now)
        with self._lock:
            self._write(f"kdactl build: {target} [{step.done}/{step.total}] {step.what} ({took:.1f} s)")


class BarProgress(NullProgress):
    """A terminal: one bar per target built, edges done of all, elapsed time; gone when closed."""

    def __init__(self, console: Any = None) -> None:
        from kdactl.emit import stderr_progress_bar

        self._bar = stderr_progress_bar(console)
        self._tasks: dict[str, Any] = {}

    def started(self, target: str, edges: int) -> None:
        if not self._tasks:
            self._bar.start()
        self._tasks[target] = self._bar.add_task(f"{target} compiling", total=edges)

    def step(self, target: str, step: NinjaStep) -> None:
        self._bar.update(
            self._tasks[target], completed=step.done, total=step.total, description=f"{target} {step.what}"
        )

    def finished(self, target: str) -> None:
        self._bar.update(self._tasks[target], description=f"{target} built")

    def close(self) -> None:
        if self._tasks:
            self._bar.stop()


def make_progress(as_json: bool, terminal: bool | None = None) -> NullProgress:
    """A bar where stderr is a terminal; else lines, or nothing under --json."""
    if terminal if terminal is not None else sys.stderr.isatty():
        return BarProgress()
    return NullProgress() if as_json else LineProgress()
