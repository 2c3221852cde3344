"""kdactl.proc: ending a child's whole session, reading /proc/PID/stat, SIGTERM as Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from kdactl.proc import parse_proc_stat, run_process, session_members, sigterm_interrupts
from tests.fakes import process_running

# A child that starts a grandchild in a process group of its own (as ninja runs each compiler),
# deaf to SIGTERM, writes the grandchild's pid, then waits.
_SPAWNER = """
import subprocess, sys, time
deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
grandchild = subprocess.Popen([sys.executable, "-c", deaf], process_group=0)
open(sys.argv[1], "w").write(str(grandchild.pid))
time.sleep(600)
"""


def test_a_timeout_ends_the_grandchild_in_a_group_of_its_own(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    result = run_process([sys.executable, "-c", _SPAWNER, str(pid_file)], env=dict(os.environ), timeout_s=3.0)
    assert result.timed_out
    grandchild = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 5
        while process_running(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_running(grandchild), "the grandchild outlived its session's kill"
    finally:
        if process_running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_session_members_lists_this_session_and_not_zombies():
    assert os.getpid() in session_members(os.getsid(0))
    assert session_members(-1) == []


@pytest.mark.parametrize("stat, expected", [
    ("4242 (nvcc) S 1 4242 4242 0 -1 4194560 105 0", ("S", 4242)),
    ("77 (my (odd) prog) R 1 70 71 0 -1", ("R", 71)),  # a name with spaces and parentheses
    ("9 (cicc) Z 1 9 5 0", ("Z", 5)),
])  # fmt: skip
def test_parse_proc_stat(stat, expected):
    assert parse_proc_stat(stat) == expected


def test_sigterm_interrupts_raises_keyboard_interrupt_then_restores_the_default():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(KeyboardInterrupt):
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; never reached
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_interrupts_keeps_a_handler_of_the_process():
    """A certify worker's own handler (kdactl.proc.end_children_on_term) stays in charge."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
