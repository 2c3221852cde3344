"""Fault injection for testing the certification pipeline itself (KDACTL_FAULT).

Values:
  wrong-result:<route>  route smokes (checks and the sanitizer payload) perturb that route's output
                        before comparing it with the reference, so the comparison must fail;
  sanitizer             the sanitizer payload also launches the planted out-of-bounds write, so
                        memcheck must report an error;
  hang                  a check sleeps forever, so the suite's time limit must end it (inconclusive);
  crash                 a check calls os.abort(), so the suite process dies (inconclusive);
  busy                  the perf stage starts a co-tenant process that keeps the GPU busy while it
                        times, so the perf gate must see it and end inconclusive (never failed);
  slow                  every KDA launch runs once more first, into spare outputs: the same results (a
                        state pool updated in place as one launch leaves it) in about twice the device
                        time, so the smokes pass and the perf gate must fail the node.
A value kdactl does not know raises ValueError: a typo must never let a run look clean. The commands
that plant faults (certify, sanitize, bench) check the variable before they touch the node
(``fault_from_env``): a bad value is a usage error (exit 2), never a run and never a certificate.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdactl.errors import UsageError
from kdactl.kernel_abi import ROUTES

ENV_VAR = "KDACTL_FAULT"
KINDS = ("wrong-result", "sanitizer", "hang", "crash", "busy", "slow")


@dataclass(frozen=True)
class Fault:
    kind: str
    route: str | None = None  # for wrong-result


def valid_values() -> str:
    return ", ".join([f"wrong-result:{r}" for r in ROUTES] + list(KINDS[1:]))


def parse_fault(value: str | None) -> Fault | None:
    """KDACTL_FAULT's value -> Fault, or None when unset/empty. ValueError names a bad value and the
    valid ones."""
    text = (value or "").strip()
    if not text:
        return None
    kind, colon, route = text.partition(":")
    if kind not in KINDS or (kind == "wrong-result") != bool(route) or (colon and not route):
        raise ValueError(f"{ENV_VAR}={text!r} is not a fault kdactl knows; valid values: {valid_values()}")
    if kind == "wrong-result":
        if route not in ROUTES:
            raise ValueError(f"{ENV_VAR}={text!r}: no route {route!r}; valid values: {valid_values()}")
        return Fault(kind, route)
    return Fault(kind)


def fault_from_env(env: Mapping[str, str]) -> Fault | None:
    """The fault a command will plant, checked up front: a bad value is a UsageError (exit 2)."""
    try:
        return parse_fault(env.get(ENV_VAR))
    except ValueError as err:
        raise UsageError(str(err)) from None


def active_fault(env: Mapping[str, str] | None = None) -> Fault | None:
    return parse_fault((os.environ if env is None else env).get(ENV_VAR))


def perturb_output(route: str, o: Any, env: Mapping[str, str] | None = None) -> Any:
    """Under wrong-result:<route>, return o shifted by 1 (a clearly wrong result); else o itself."""
    fault = active_fault(env)
    if fault is None or fault.kind != "wrong-result":
        return o
    return o + 1.0 if route == fault.route else o


def hang_or_crash(env: Mapping[str, str] | None = None) -> None:
    """Under hang, sleep forever; under crash, abort the process. Otherwise return at once."""
    fault = active_fault(env)
    if fault is None:
        return
    if fault.kind == "hang":
        while True:
            time.sleep(3600)
    if fault.kind == "crash":
        os.abort()


def wants_sanitizer_fault(env: Mapping[str, str] | None = None) -> bool:
    fault = active_fault(env)
    return fault is not None and fault.kind == "sanitizer"


def is_active(kind: str, env: Mapping[str, str] | None = None) -> bool:
    fault = active_fault(env)
    return fault is not None and fault.kind == kind


COTENANT_S = 900.0  # the co-tenant's own limit, should nobody stop it


def start_cotenant(python: str | None = None) -> subprocess.Popen:
    """KDACTL_FAULT=busy: another process that holds a CUDA context on this GPU and keeps it busy
    with matrix products. Returns once it is running; the caller stops it (stop_cotenant)."""
    import sys

    code = ("import sys, time, torch\n"
            "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
            "torch.cuda.synchronize(); print('ready', flush=True)\n"
            f"end = time.monotonic() + {COTENANT_S}\n"
            "while time.monotonic() < end:\n"
            "    for _ in range(16): a = (a @ a).clamp_(-1, 1)\n"
            "    torch.cuda.synchronize()\n")  # fmt: skip
    proc = subprocess.Popen([python or sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)  # fmt: skip
    line = proc.stdout.readline() if proc.stdout else ""
    if line.strip() != "ready":
        stop_cotenant(proc)
        raise RuntimeError(f"KDACTL_FAULT=busy: the co-tenant process did not start (exit {proc.returncode})")
    return proc


def stop_cotenant(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)
