"""Remembered call plans: what validating and routing one eager prefill call decided, kept under
the call's metadata (every tensor's shape, dtype, device and contiguity, and the options), so that
a serving engine repeating a few shapes pays only for the per-call checks and the launch.

The per-call checks are the ones metadata cannot settle: every pointer's 16-byte alignment and the
host copy of cu_seqlens; a call failing one takes the full path, which raises the ValueError naming
it. Any other difference is another key, so it too takes the full path, which validates it before
its plan is kept. Calls whose checks need values on the device (cu_seqlens without its host copy)
or whose outputs depend on them (checkpoints) always take the full path.

Two tables keep plans with the same rules: kdactl_host (csrc/host/kdactl_host.cpp), which runs a
planned call in one native step, once a call on the GPU has built or loaded it; and this module's
dict, where that module cannot be built (or KDACTL_HOST_MODULE=0), under KDACTL_FAULT=slow, and for
CPU tensors (tests). tests/kda_plan_cases.py runs both on one table of keys that must miss and of
host bounds; kdactl_host checks the call's field order and its constants against kdactl.kernel_abi.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch

from kdactl.errors import KdactlError
from kdactl.jit.host import DISABLE_ENV, disabled, load_host_module
from kdactl.kda.call import TENSOR_COUNT, PrefillCall
from kdactl.kda.device import kernels
from kdactl.kda.launch import slow_fault
from kdactl.kda.outputs import outputs
from kdactl.kda.problem import KdaProblem
from kdactl.kda.validation import check_bounds, host_bounds
from kdactl.kernel_abi import MAX_PLANS
from kdactl.settings import Settings

log = logging.getLogger("kdactl.kda")


class CallPlan:
    """The validated problem (its facts size the outputs) and the launch (kdactl.kda.launch.LaunchPlan)."""

    __slots__ = ("problem", "launch")

    def __init__(self, problem: KdaProblem, launch):
        self.problem, self.launch = problem, launch


_PLANS: dict[tuple, CallPlan] = {}
_Tensor = torch.Tensor


def run(options: tuple, call: PrefillCall):
    """A planned call's result, launched; None when it has no plan or fails a per-call check."""
    if _HOST is not None and call.q.is_cuda:  # CPU tensors (tests, beside GPU ones): the dict
        result = _HOST.run(options, call)
        if result.__class__ is list:  # [rc, LaunchPlan]: the launcher refused
            result[1].check(result[0])
        return result
    key, aligned = call_key(call, options)
    plan = lookup(key)
    if plan is None or not aligned or (call.cu_seqlens_cpu is not None
                                       and not bounds_ok(call.cu_seqlens_cpu, call.cu_seqlens, plan.problem.seqlen)):  # fmt: skip
        return None
    o, final_state = outputs(call.out, call.q, call.v, plan.problem, options[1], check=False)
    return launch(plan, call, o, final_state)


def remember(options: tuple, call: PrefillCall, plan: CallPlan) -> None:
    """Keep the plan of a call that the full path validated and launched."""
    if _HOST is None and not _DECIDED and call.q.is_cuda:
        _choose_table()
    if _HOST is not None and call.q.is_cuda:
        lp, p = plan.launch, plan.problem
        state_shape = (p.num_seqs, p.heads, *p.state_shape) if options[1] else ()
        _HOST.remember(options, call, bytes(lp.template), lp.address, lp.need, lp.device_index, p.seqlen, state_shape,
                       lp)  # fmt: skip
        return
    key, _ = call_key(call, options)
    if key is None:
        return
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.clear()
    try:
        _PLANS[key] = plan
    except TypeError:  # an unhashable option: never planned
        pass


def launch(plan: CallPlan, call: PrefillCall, o, final_state):
    """Launch a call on checked inputs and outputs; prefill's return value."""
    stream = call.workspace.claim(call.q.device) if call.workspace is not None else None
    if call.state_pool is not None:
        final_state = call.state_pool
    plan.launch.launch(call, o, final_state, stream)
    return (o, final_state) if call.checkpoints is None else (o, final_state, call.checkpoints)


def call_key(call: PrefillCall, options: tuple) -> tuple[tuple | None, bool]:
    """(key, aligned): the key of a call, from every tensor's shape, dtype, device and contiguity
    (the call's tensors, then ``out``'s) and the ``options``; None when the call cannot be planned
    (an argument that is not a tensor). ``aligned``: every pointer is 16-byte aligned. One flat
    loop: this runs on every call."""
    out = call.out
    pair = type(out) is tuple
    key: list[Any] = [options, pair]
    aligned = True
    # The call's tensors, then out's (the field after them): one tuple either way.
    for x in (*call[:TENSOR_COUNT], *out) if pair else call[: TENSOR_COUNT + 1]:
        if x is None:
            key.append(None)
            continue
        if type(x) is not _Tensor:
            return None, False  # the full path says what is wrong with it (subclasses take it too)
        key += (x.shape, x.dtype, x.get_device(), x.is_contiguous())
        if x.data_ptr() & 15 and x.numel():
            aligned = False
    return tuple(key), aligned


def lookup(key: tuple | None) -> CallPlan | None:
    if key is None:
        return None
    try:
        return _PLANS.get(key)
    except TypeError:  # an unhashable option: never planned
        return None


def forget_all() -> None:
    _PLANS.clear()
    if _HOST is not None:
        _HOST.forget_all()


def bounds_ok(cu_seqlens_cpu, cu_seqlens, seqlen: int) -> bool:
    """The host copy of cu_seqlens, checked as the full path checks it; False sends the call down
    the full path, which raises the ValueError naming what is wrong."""
    try:
        check_bounds(host_bounds(cu_seqlens_cpu, cu_seqlens), seqlen)
    except ValueError:
        return False
    return True


_HOST = None  # kdactl_host once chosen
_DECIDED = False
_STATUS = "python: no call on the GPU yet"


def host_status() -> str:
    """Which table keeps the plans, and why: "kdactl_host (built|cache)" or "python: <reason>"."""
    return _STATUS


def _choose_table() -> None:
    """kdactl_host when it builds or loads, else this module's dict (a warning says why)."""
    global _HOST, _DECIDED, _STATUS
    _DECIDED = True
    settings = Settings.from_env()
    if disabled(settings):
        _STATUS = f"python: {DISABLE_ENV}={settings.env.get(DISABLE_ENV)}"
        return
    if slow_fault():  # its spare launch is LaunchPlan.launch's
        _STATUS = "python: KDACTL_FAULT=slow"
        return
    lib = kernels()
    try:
        module, entry = load_host_module(settings, lib.target)
    except (KdactlError, OSError) as err:
        _STATUS = f"python: kdactl_host unavailable: {err}"
        log.warning("kdactl: eager prefill plans stay in Python (%s)", err)
        return
    capture_id = ctypes.cast(lib.lib.kdactl_stream_capture_id, ctypes.c_void_p).value
    module.configure(torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice, capture_id)
    _HOST, _STATUS = module, f"kdactl_host ({'built' if entry.built else 'cache'})"
