"""Fault injection for testing the certification pipeline itself (KDACTL_FAULT).

Values:
  wrong-result:<route>  route smokes (checks and the sanitizer payload) perturb that route's output
                        before comparing it with the reference, so the comparison must fail;
  sanitizer             the sanitizer payload also launches the planted out-of-bounds write, so
                        memcheck must report an error;
  hang                  a check sleeps forever, so the suite's time limit must end it (inconclusive);
  crash                 a check calls os.abort(), so the suite process dies (inconclusive).
A value kdactl does not know raises ValueError: a typo must never let a run look clean.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

ENV_VAR = "KDACTL_FAULT"
KINDS = ("wrong-result", "sanitizer", "hang", "crash")


@dataclass(frozen=True)
class Fault:
    kind: str
    route: str | None = None  # for wrong-result


def parse_fault(value: str | None) -> Fault | None:
    """KDACTL_FAULT's value -> Fault, or None when unset/empty. ValueError names a bad value."""
    text = (value or "").strip()
    if not text:
        return None
    kind, _, route = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"{ENV_VAR} must be one of wrong-result:<route>, sanitizer, hang, crash; got {text!r}")
    if kind == "wrong-result":
        if not route:
            raise ValueError(f"{ENV_VAR}=wrong-result needs a route, e.g. wrong-result:direct; got {text!r}")
        return Fault(kind, route)
    if route:
        raise ValueError(f"{ENV_VAR}={kind} takes no argument; got {text!r}")
    return Fault(kind)


def active_fault(env: Mapping[str, str] | None = None) -> Fault | None:
    return parse_fault((os.environ if env is None else env).get(ENV_VAR))


def perturb_output(route: str, o: Any, env: Mapping[str, str] | None = None) -> Any:
    """Under wrong-result:<route>, return o shifted by 1 (a clearly wrong result); else o itself."""
    fault = active_fault(env)
    if fault is None or fault.kind != "wrong-result":
        return o
    from kdactl.kda import ROUTES

    if fault.route not in ROUTES:
        raise ValueError(f"{ENV_VAR}=wrong-result:{fault.route}: no such route; routes: {', '.join(ROUTES)}")
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
