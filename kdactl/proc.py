"""Child processes with a time limit, behind one small interface (tests pass a fake runner).

Each child starts in a session of its own, so a timeout kills its whole process group: a hung
kernel or a pytest that spawned helpers cannot outlive the limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence


@dataclass(frozen=True)
class ProcResult:
    returncode: int | None  # None when the child was killed for the time limit or never started
    output: str  # stdout and stderr together
    duration_s: float
    timed_out: bool = False
    start_error: str = ""  # why the child could not start (program missing); "" when it ran

    def tail(self, chars: int = 800) -> str:
        """The end of the output on one line, for messages."""
        text = " | ".join(line.strip() for line in self.output.strip().splitlines()[-12:] if line.strip())
        return text if len(text) <= chars else "..." + text[-chars:]


class ProcessRunner(Protocol):
    def __call__(
        self, cmd: Sequence[str], *, env: Mapping[str, str], timeout_s: float, cwd: Path | None = None
    ) -> ProcResult: ...


def run_process(cmd: Sequence[str], *, env: Mapping[str, str], timeout_s: float, cwd: Path | None = None) -> ProcResult:
    """The real runner: output captured, process group killed (SIGKILL) on timeout."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(cmd), env=dict(env), cwd=None if cwd is None else str(cwd), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    except OSError as err:
        return ProcResult(None, "", 0.0, start_error=f"cannot run {cmd[0]}: {err.strerror or err}")
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return ProcResult(proc.returncode, _text(out), time.monotonic() - start)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild outside the group still holds the pipe
            out = b""
        return ProcResult(None, _text(out), time.monotonic() - start, timed_out=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
