"""Remembered call plans: what validating and routing one eager prefill call decided, kept under
the call's metadata (every tensor's shape, strides, dtype and device, and the options), so that a
serving engine repeating a few shapes pays only for the per-call checks and the launch.

The per-call checks are the ones metadata cannot settle: every pointer's 16-byte alignment and the
host copy of cu_seqlens; a call failing one takes the full path, which raises the ValueError naming
it. Any other difference is another key, so it too takes the full path, which validates it before
its plan is kept. Calls whose checks need
values on the device (cu_seqlens without its host copy) or whose outputs depend on them
(checkpoints) always take the full path.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from kdactl.kda.problem import KdaProblem, check_bounds, host_bounds

MAX_PLANS = 1024  # distinct call shapes kept; more and the table starts over


class CallPlan:
    __slots__ = ("problem", "launch", "o_shape", "o_dtype", "state_shape")

    def __init__(self, problem: KdaProblem, launch, o_shape, o_dtype, state_shape: Optional[tuple]):
        self.problem, self.launch = problem, launch
        self.o_shape, self.o_dtype, self.state_shape = o_shape, o_dtype, state_shape


_PLANS: dict[tuple, CallPlan] = {}
_TENSOR_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias", "state_pool",
                "state_indices")  # fmt: skip


def _meta(x: Any):
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError  # not plannable: the full path says what is wrong with it
    return x.shape, x.stride(), x.dtype, x.get_device()


def call_key(tensors: tuple, out: Any, options: tuple) -> Optional[tuple]:
    """The key of a call: metadata of ``tensors`` (in _TENSOR_ARGS order) and of ``out``, and the
    hashable ``options``; None when the call cannot be planned."""
    try:
        outs = out if isinstance(out, tuple) else (out,)
        key = (tuple(map(_meta, tensors)), type(out) is tuple, tuple(map(_meta, outs)), options)
        hash(key)
    except TypeError:
        return None
    return key


def lookup(key: Optional[tuple]) -> Optional[CallPlan]:
    return _PLANS.get(key) if key is not None else None


def remember(key: Optional[tuple], plan: CallPlan) -> None:
    if key is None:
        return
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan


def forget_all() -> None:
    _PLANS.clear()


def call_ok(tensors: tuple, out: Any, cu_seqlens_cpu, seqlen: int) -> bool:
    """The checks metadata cannot settle. False sends the call down the full path, which raises
    the ValueError naming what is wrong."""
    outs = out if isinstance(out, tuple) else (out,)
    for x in (*tensors, *outs):
        if x is not None and x.data_ptr() % 16 and x.numel():
            return False
    if cu_seqlens_cpu is not None:
        try:
            check_bounds(host_bounds(cu_seqlens_cpu, tensors[6]), seqlen)
        except ValueError:
            return False
    return True
