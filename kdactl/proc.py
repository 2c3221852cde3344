"""Child processes with a time limit, behind one small interface (tests pass a fake runner): the
one process spawner of kdactl's runs (suite, sanitizers, certify's workers).

Each child starts in a session of its own, so a timeout ends its whole session, SIGTERM first (a
worker can still stop its own children), SIGKILL after a grace: a hung kernel, a pytest that spawned
helpers, or a compiler that ninja ran in a process group of its own cannot outlive the limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


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


KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL of a timed-out group


INTERRUPTED = "not started: the run was interrupted"


class Children:
    """The live children of one run (certify's workers on every GPU), so that an interrupt ends
    them all: children lead sessions of their own, so the terminal's Ctrl-C never reaches them."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: cancel may run in a signal handler (end_children_on_term)
        self._live: set[subprocess.Popen] = set()
        self.cancelled = False

    def start(self, spawn) -> subprocess.Popen | None:
        """``spawn()`` under the lock, tracked; None once cancelled (nothing new starts)."""
        with self._lock:
            if self.cancelled:
                return None
            proc = spawn()
            self._live.add(proc)
            return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._live.discard(proc)

    def cancel(self, grace_s: float = KILL_GRACE_S) -> None:
        """End every live child and start no more (kill_groups: one grace period for all)."""
        with self._lock:
            self.cancelled = True
            live = list(self._live)
        kill_groups(live, grace_s)


LIVE = Children()  # every child run_process starts in this process unless the caller tracks its own


def end_children_on_term(grace_s: float = 1.0) -> None:
    """On SIGTERM, end this process's children, then exit 143. For a process that is itself ended
    by group (certify's worker): its children lead groups of their own (a pytest run, the
    sanitizers), which its killer's killpg does not reach. The grace is shorter than the killer's."""

    def handler(signum: int, frame: object) -> None:
        LIVE.cancel(grace_s)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside: SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that one cleanup path (end the
    children, drop temporary files) serves a supervisor's kill too. Only in the main thread and
    where SIGTERM has its default action: a process with a handler of its own keeps it."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_process(cmd: Sequence[str], *, env: Mapping[str, str], timeout_s: float, cwd: Path | None = None,
                log: Path | None = None, children: Children | None = None) -> ProcResult:  # fmt: skip
    """The real runner: output captured (or written to ``log``, and its end returned), process
    group ended on timeout (kill_groups); tracked in ``children`` when given (start_error
    INTERRUPTED once that was cancelled)."""
    start = time.monotonic()
    sink = open(log, "wb") if log is not None else None
    track = children or LIVE
    try:
        try:
            proc = track.start(lambda: subprocess.Popen(
                list(cmd), env=dict(env), cwd=None if cwd is None else str(cwd), stdin=subprocess.DEVNULL,
                stdout=sink or subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            ))  # fmt: skip
        except OSError as err:
            return ProcResult(None, "", 0.0, start_error=f"cannot run {cmd[0]}: {err.strerror or err}")
        if proc is None:
            return ProcResult(None, "", 0.0, start_error=INTERRUPTED)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            return ProcResult(proc.returncode, _output(out, log), time.monotonic() - start)
        except subprocess.TimeoutExpired:
            kill_groups([proc])
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a grandchild outside the group still holds the pipe
                out = b""
            return ProcResult(None, _output(out, log), time.monotonic() - start, timed_out=True)
        finally:
            track.done(proc)
    finally:
        if sink is not None:
            sink.close()


def kill_groups(procs: Sequence[subprocess.Popen], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM every child's session, wait out one grace period for all of them together, then
    SIGKILL whatever of each session is left."""
    for proc in procs:
        _signal_session(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        _signal_session(proc, signal.SIGKILL)  # the other members too (a pytest or sanitizer run, compilers)


def _signal_session(proc: subprocess.Popen, sig: int) -> None:
    """The child's process group, then every other process of its session: the child leads both
    (start_new_session), and its descendants stay in the session even in groups of their own."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        if sig == signal.SIGKILL and proc.poll() is None:
            proc.kill()
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def session_members(session: int) -> list[int]:
    """The live (not zombie) processes of a session, from /proc; [] where there is no /proc."""
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []
    members = []
    for name in entries:
        try:
            with open(f"/proc/{name}/stat") as f:
                state, sid = parse_proc_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if sid == session and state != "Z":
            members.append(int(name))
    return members


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state, session id) from /proc/PID/stat; the command name in parentheses may hold spaces
    and parentheses itself, so fields are counted from its last ')'."""
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def _output(out: bytes | None, log: Path | None) -> str:
    """The captured output, or the end of the log file (64 KiB) the child wrote into."""
    if log is None:
        return _text(out)
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            return _text(f.read())
    except OSError:
        return ""


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
