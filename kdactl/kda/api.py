"""``kdactl.kda.prefill``: the op's one entry point. It describes the call once (a PrefillCall); the
full path validates it, routes and launches it, and keeps its plan; a repeated call with the same
metadata takes its plan (kdactl.kda.plans) and launches with its own pointers."""

from __future__ import annotations

import functools

import torch

import kdactl.kda.plans as plans
from kdactl.kda.call import PrefillCall
from kdactl.kda.custom_op import traced_prefill
from kdactl.kda.device import device_info
from kdactl.kda.launch import LaunchPlan
from kdactl.kda.outputs import outputs
from kdactl.kda.routes import decide_route
from kdactl.kda.tuning import AUTO
from kdactl.kda.validation import validate_call


def prefill(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
            cu_seqlens=None, cu_seqlens_cpu=None, route="auto", workspace=None, out=None, tuning=AUTO,
            fused=None, A_log=None, dt_bias=None, state_pool=None, state_indices=None, state_v_first=False,
            checkpoint_every=None, checkpoints=None, checkpoint_dtype=None):  # fmt: skip
    """KDA prefill. Returns ``(o, final_state or None)``, and the checkpoints as a third item when
    ``checkpoint_every`` is given; see SPEC.md "The KDA op". q, k, v are bf16 or fp16 (o: the same),
    g and beta fp32, bf16 or fp16.

    ``out`` is a preallocated o tensor, or a tuple ``(o, final_state)``; with ``workspace`` (a
    KdaWorkspace) and ``out`` the call allocates nothing, so it can be captured in a CUDA graph.
    ``tuning`` (a kdactl.kda.Tuning) forces a kernel variant: benchmarks only (AUTO: the launcher's choice).
    ``cu_seqlens_cpu`` (a list or CPU tensor equal to cu_seqlens) lets the call check the bounds on
    the host: without it, cu_seqlens is read back from the device, which synchronizes it.
    An eager call launches directly (no torch dispatch); under torch.compile it is one custom op.
    ``fused`` (a kdactl.kda.fused.Fused) asks the kernels for fla's input transforms (q/k l2norm, the
    gate from raw g with ``A_log`` / ``dt_bias``, beta's sigmoid) where they load; v may have a
    multiple of q's heads (grouped values: g, beta, state and o then have v's heads).
    ``state_pool`` fp32 [P, H, K, V] with ``state_indices`` int32 [N]: sequence n starts from
    ``state_pool[state_indices[n]]`` and its final state is written back there, in place (a negative
    index: zero start, nothing written); returns ``(o, state_pool)``.
    ``state_v_first``: every state (initial, final, pool, checkpoints) is [V, K] per head, not [K, V].
    ``checkpoint_every`` C (a multiple of 16): prefix checkpoints, fla's return_intermediate_states
    layout: entry j of sequence n is its state before token j * C, for j < ceil(len_n / C), at row
    (checkpoints of the sequences before it) + j of a [B, rows, H, K, V] tensor (varlen: B = 1, rows
    the sum over sequences). ``checkpoints`` is that tensor preallocated (fp32 or bf16; varlen: rows
    may be more than needed); without it, it is allocated (``checkpoint_dtype``: fp32 or bf16, fp32
    when None), which needs the varlen bounds on the host (``cu_seqlens_cpu``, or a read-back that
    synchronizes).
    """
    call = _new_call((q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, state_pool, state_indices, out,
                      cu_seqlens_cpu, workspace, scale, output_final_state, route, tuning, fused, state_v_first,
                      checkpoint_every, checkpoints, checkpoint_dtype))  # fmt: skip
    if torch.compiler.is_compiling():  # tracing reads no pointers and no device facts
        return _traced(call)
    options = None  # the plan key's options, for a call that a plan can settle
    if checkpoint_every is None and checkpoints is None and checkpoint_dtype is None and (
            cu_seqlens is None or cu_seqlens_cpu is not None):  # fmt: skip
        options = (scale, bool(output_final_state), route, tuning, fused, bool(state_v_first), workspace is not None,
                   type(cu_seqlens_cpu))  # fmt: skip
        result = plans.run(options, call)
        if result is not None:
            return result
    return _full_call(call, options)


_new_call = functools.partial(tuple.__new__, PrefillCall)  # PrefillCall._make without its Python frame


def _full_call(call: PrefillCall, options: tuple | None):
    """Validate everything, decide the route, launch; keep the plan under ``options`` when given."""
    problem, call = validate_call(call, runtime=True)
    o, final_state = outputs(call.out, call.q, call.v, problem, call.output_final_state)
    device = device_info(call.q.device)
    route_id = decide_route(problem, device, call.route).id  # an ineligible forced route fails here
    plan = plans.CallPlan(problem, LaunchPlan.of(problem, device, route_id, call))
    result = plans.launch(plan, call, o, final_state)
    if options is not None:
        plans.remember(options, call, plan)  # after a launch that worked
    return result


def _traced(call: PrefillCall):
    """Under torch.compile: one opaque op in the graph, which decides the route when it runs."""
    problem, call = validate_call(call, runtime=False)
    o, final_state = outputs(call.out, call.q, call.v, problem, call.output_final_state, eager=False)
    traced_prefill(call, o, final_state)
    return o, final_state
