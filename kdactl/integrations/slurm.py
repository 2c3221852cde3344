"""``kdactl slurm drain|resume``: take this node out of Slurm, and put it back only if kdactl took it out.

A drain kdactl makes carries a reason that starts with ``kdactl:``. ``resume`` reads the node's
current reason (``scontrol show node``) and resumes only a node drained with such a reason: a node
an operator drained ("maint by ops") stays drained whatever kdactl thinks of its GPUs.

scontrol sits behind a small runner (argv -> returncode, stdout, stderr) so tests pass a fake.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kdactl.errors import EXIT_PASS, Inconclusive, ToolMissing, UsageError
from kdactl.settings import Settings

OWNED_PREFIX = "kdactl:"
MAX_REASON = 200  # scontrol takes longer, but sinfo -R and operators' screens do not
_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")  # slurmctld appends " [user@time]" to the reason


class Runner(Protocol):
    def run(self, argv: list[str]) -> tuple[int, str, str]: ...


class SubprocessRunner:
    def __init__(self, timeout_s: float = 30.0, env: Mapping[str, str] | None = None):
        self.timeout_s = timeout_s
        self.env = None if env is None else dict(env)  # None: this process's environment (SLURM_CONF etc.)

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.env)
        except FileNotFoundError:
            raise ToolMissing(f"{argv[0]} not found on PATH: is this a Slurm node?") from None
        except subprocess.TimeoutExpired:
            raise Inconclusive(
                f"{' '.join(argv[:3])} did not answer within {self.timeout_s:g} s (is slurmctld up?)"
            ) from None
        return p.returncode, p.stdout, p.stderr


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # e.g. "IDLE+DRAIN"
    reason: str  # without slurmctld's " [user@time]" suffix; "" when none

    @property
    def drained(self) -> bool:
        return any(flag in self.state.split("+") for flag in ("DRAIN", "DRAINED", "DRAINING"))

    @property
    def owned(self) -> bool:
        return self.reason.startswith(OWNED_PREFIX)


@dataclass
class SlurmReport:
    action: str  # drain | resume
    node: str
    done: str  # what happened: drained | resumed | kept | nothing
    message: str
    before: NodeState | None = None
    commands: list[list[str]] = field(default_factory=list)
    exit_code: int = EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        before = None if self.before is None else {"state": self.before.state, "reason": self.before.reason}
        return {"command": f"slurm {self.action}", "node": self.node, "result": self.done, "message": self.message,
                "before": before, "scontrol": self.commands, "exit_code": self.exit_code}  # fmt: skip

    def render(self, console: Any) -> None:
        console.print(f"{self.done}: {self.node}: {self.message}", markup=False)


def this_node(env: Mapping[str, str], node: str | None = None) -> str:
    """--node, else SLURMD_NODENAME (set for Prolog and HealthCheckProgram), else the short hostname."""
    return node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def owned_reason(reason: str | None) -> str:
    text = " ".join((reason or "node failed kdactl gate").split())
    if text.startswith(OWNED_PREFIX):
        text = text[len(OWNED_PREFIX) :].strip()
    full = f"{OWNED_PREFIX} {text}"
    return full if len(full) <= MAX_REASON else full[: MAX_REASON - 3] + "..."


def parse_show_node(text: str, name: str) -> NodeState:
    """``scontrol show node NAME`` output -> NodeState. The reason runs to the end of its line."""
    state = reason = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            reason = _STAMP.sub("", line[len("Reason=") :])
        m = re.search(r"(?:^|\s)State=(\S+)", line)
        if m and state is None:
            state = m.group(1)
    if state is None:
        raise Inconclusive(f"scontrol show node {name}: no State= in its output: {text.strip()[:200]!r}")
    return NodeState(name, state, "" if reason in (None, "(null)") else reason)


def show_node(runner: Runner, name: str) -> NodeState:
    argv = ["scontrol", "show", "node", name]
    rc, out, err = runner.run(argv)
    if rc != 0:
        raise Inconclusive(f"{' '.join(argv)} exited {rc}: {(err or out).strip()[:300]}")
    return parse_show_node(out, name)


def _update(runner: Runner, report: SlurmReport, argv: list[str]) -> None:
    report.commands.append(argv)
    rc, out, err = runner.run(argv)
    if rc != 0:
        raise Inconclusive(f"{' '.join(argv[:3])} exited {rc}: {(err or out).strip()[:300]}")


def drain_command(settings: Settings, reason: str | None = None, node: str | None = None,
                  runner: Runner | None = None) -> SlurmReport:  # fmt: skip
    """Drain with a ``kdactl:`` reason. A node an operator already drained keeps their reason."""
    check_reason_option(reason)
    r = runner or SubprocessRunner()
    name = this_node(settings.env, node)
    before = show_node(r, name)
    report = SlurmReport("drain", name, "drained", "", before)
    if before.drained and before.reason and not before.owned:
        report.done, report.message = (
            "kept",
            f"already drained by someone else (reason {before.reason!r}); left as it is",
        )
        return report
    full = owned_reason(reason)
    _update(r, report, ["scontrol", "update", f"nodename={name}", "state=drain", f"reason={full}"])
    report.message = f"state drain, reason {full!r}"
    return report


def resume_command(settings: Settings, node: str | None = None, runner: Runner | None = None) -> SlurmReport:
    """Resume only a node that kdactl drained; say why when it does not."""
    r = runner or SubprocessRunner()
    name = this_node(settings.env, node)
    before = show_node(r, name)
    report = SlurmReport("resume", name, "resumed", "", before)
    if not before.drained:
        report.done, report.message = "nothing", f"not drained (state {before.state})"
    elif not before.owned:
        report.done = "kept"
        report.message = (
            f"drained with reason {before.reason!r}, which kdactl did not write: left drained for the operator"
        )
    else:
        _update(r, report, ["scontrol", "update", f"nodename={name}", "state=resume"])
        report.message = f"was {before.state} with reason {before.reason!r}"
    return report


def check_reason_option(reason: str | None) -> None:
    if reason is not None and not reason.strip():
        raise UsageError("--reason must not be empty")
