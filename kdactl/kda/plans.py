"""Remembered call plans: what validating and routing one eager prefill call decided, kept under
the call's metadata (every tensor's shape, dtype, device and contiguity, and the options), so that
a serving engine repeating a few shapes pays only for the per-call checks and the launch.

The per-call checks are the ones metadata cannot settle: every pointer's 16-byte alignment and the
host copy of cu_seqlens; a call failing one takes the full path, which raises the ValueError naming
it. Any other difference is another key, so it too takes the full path, which validates it before
its plan is kept. Calls whose checks need values on the device (cu_seqlens without its host copy)
or whose outputs depend on them (checkpoints) always take the full path.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from kdactl.kda.problem import KdaProblem, check_bounds, host_bounds

MAX_PLANS = 1024  # distinct call shapes kept; more and the table starts over


class CallPlan:
    """The validated problem (its facts size the outputs) and the launch (kdactl.kda.op.LaunchPlan)."""

    __slots__ = ("problem", "launch")

    def __init__(self, problem: KdaProblem, launch):
        self.problem, self.launch = problem, launch


_PLANS: dict[tuple, CallPlan] = {}
_Tensor = torch.Tensor


def is_compiling() -> bool:
    """Whether torch.compile is tracing this call (prefill asks before it has imported torch)."""
    return torch.compiler.is_compiling()


def call_key(tensors: tuple, out: Any, options: tuple) -> tuple[Optional[tuple], bool]:
    """(key, aligned): the key of a call, from every tensor's shape, dtype, device and contiguity
    (``tensors`` in a fixed order, then ``out``'s) and the ``options``; None when the call cannot be
    planned (an argument that is not a tensor). ``aligned``: every pointer is 16-byte aligned. One
    flat loop: this runs on every call."""
    outs = out if type(out) is tuple else (out,)
    key: list[Any] = [options, type(out) is tuple]
    aligned = True
    for x in (*tensors, *outs):
        if x is None:
            key.append(None)
            continue
        if type(x) is not _Tensor:
            return None, False  # the full path says what is wrong with it (subclasses take it too)
        key += (x.shape, x.dtype, x.get_device(), x.is_contiguous())
        if x.data_ptr() & 15 and x.numel():
            aligned = False
    return tuple(key), aligned


def lookup(key: Optional[tuple]) -> Optional[CallPlan]:
    if key is None:
        return None
    try:
        return _PLANS.get(key)
    except TypeError:  # an unhashable option: never planned
        return None


def remember(key: Optional[tuple], plan: CallPlan) -> None:
    if key is None:
        return
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    try:
        _PLANS[key] = plan
    except TypeError:
        pass


def forget_all() -> None:
    _PLANS.clear()


def bounds_ok(cu_seqlens_cpu, cu_seqlens, seqlen: int) -> bool:
    """The host copy of cu_seqlens, checked as the full path checks it; False sends the call down
    the full path, which raises the ValueError naming what is wrong."""
    try:
        check_bounds(host_bounds(cu_seqlens_cpu, cu_seqlens), seqlen)
    except ValueError:
        return False
    return True
