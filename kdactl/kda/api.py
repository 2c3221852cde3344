"""``kdactl.kda.prefill``: the op's one entry point. A call is validated, routed and launched once
on the full path, which keeps its plan; a repeated call with the same metadata takes its plan
(kdactl.kda.plans) and launches with its own pointers."""

from __future__ import annotations

import dataclasses

import torch

import kdactl.kda.plans as plans
from kdactl.kda.custom_op import UNDECIDED, kda_prefill_
from kdactl.kda.device import device_info
from kdactl.kda.fused import NONE, Fused
from kdactl.kda.launch import LaunchPlan
from kdactl.kda.routes import decide_route
from kdactl.kda.validation import validate, validate_checkpoints, validate_fused, validate_pool
from kdactl.kernel_abi import TUNING_AUTO


def prefill(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
            cu_seqlens=None, cu_seqlens_cpu=None, route="auto", workspace=None, out=None, tuning=TUNING_AUTO,
            fused=None, A_log=None, dt_bias=None, state_pool=None, state_indices=None, state_v_first=False,
            checkpoint_every=None, checkpoints=None, checkpoint_dtype=None):  # fmt: skip
    """KDA prefill. Returns ``(o, final_state or None)``, and the checkpoints as a third item when
    ``checkpoint_every`` is given; see SPEC.md "The KDA op". q, k, v are bf16 or fp16 (o: the same),
    g and beta fp32, bf16 or fp16.

    ``out`` is a preallocated o tensor, or a tuple ``(o, final_state)``; with ``workspace`` (a
    KdaWorkspace) and ``out`` the call allocates nothing, so it can be captured in a CUDA graph.
    ``tuning`` picks a route-specific kernel variant (benchmarks only; TUNING_AUTO = the launcher's choice).
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
    eager = not torch.compiler.is_compiling()  # tracing reads no pointers and no device facts
    planned = None  # (options, tensors) of a call that can be planned
    if eager and checkpoint_every is None and checkpoints is None and checkpoint_dtype is None and (
            cu_seqlens is None or cu_seqlens_cpu is not None):  # fmt: skip
        planned = ((scale, bool(output_final_state), route, tuning, fused, bool(state_v_first), workspace is not None,
                    type(cu_seqlens_cpu)),
                   (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, state_pool, state_indices))  # fmt: skip
        result = plans.run(planned[0], out, cu_seqlens_cpu, workspace, planned[1])
        if result is not None:
            return result
    return _full_call(planned, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu,
                      route, workspace, out, tuning, fused, A_log, dt_bias, state_pool, state_indices, state_v_first,
                      checkpoint_every, checkpoints, checkpoint_dtype, eager)  # fmt: skip


def _full_call(planned, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, route,
               workspace, out, tuning, fused, A_log, dt_bias, state_pool, state_indices, state_v_first,
               checkpoint_every, checkpoints, checkpoint_dtype, eager):  # fmt: skip
    """Validate everything, decide the route, launch; keep the plan of a ``planned`` call."""
    problem = validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                       runtime=eager, state_v_first=state_v_first)  # fmt: skip
    fused = NONE if fused is None else fused
    if not isinstance(fused, Fused):
        raise ValueError(f"kdactl.kda.prefill: fused must be a kdactl.kda.fused.Fused, got {type(fused).__name__}")
    validate_fused(fused, A_log, dt_bias, problem, q.device, runtime=eager)
    validate_pool(state_pool, state_indices, problem, q.device, runtime=eager)
    if state_pool is not None:
        if initial_state is not None or output_final_state or (isinstance(out, tuple) and out[1] is not None):
            raise ValueError("kdactl.kda.prefill: state_pool holds the initial and final states: give no "
                             "initial_state, output_final_state or final_state buffer with it")  # fmt: skip
        if not eager:
            raise ValueError("kdactl.kda.prefill: state_pool is not supported under torch.compile yet")
        problem = dataclasses.replace(problem, state_pool=True)
    if checkpoint_every is not None or checkpoints is not None or checkpoint_dtype is not None:
        if not eager:
            raise ValueError("kdactl.kda.prefill: checkpoints are not supported under torch.compile yet")
        checkpoints = validate_checkpoints(checkpoint_every, checkpoints, problem, q.device, cu_seqlens, cu_seqlens_cpu,
                                           dtype=checkpoint_dtype)  # fmt: skip
        problem = dataclasses.replace(problem, checkpoint_every=checkpoint_every)
    o, final_state = plans.outputs(out, q, v, problem, output_final_state, eager)
    scale = problem.key_dim**-0.5 if scale is None else float(scale)
    if not eager:  # one opaque op in the graph; it decides the route when it runs
        scratch = workspace.buffer if workspace is not None else None
        kda_prefill_(q, k, v, g, beta, initial_state, cu_seqlens, o, final_state, scratch, scale, route, UNDECIDED,
                     int(tuning), A_log, dt_bias, fused.qk_l2norm, fused.beta_mode, fused.gate_mode,
                     float(fused.lower_bound), bool(state_v_first))  # fmt: skip
        return o, final_state
    device = device_info(q.device)
    route_id = decide_route(problem, device, route).id  # an ineligible forced route fails here
    plan = plans.CallPlan(problem, LaunchPlan.of(problem, device, route_id, q, scale, int(tuning), fused, cu_seqlens,
                                                 checkpoints))  # fmt: skip
    tensors = (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, state_pool, state_indices)
    result = plans.launch(plan, tensors, o, final_state, workspace, checkpoints)
    if planned is not None:
        plans.remember(planned[0], out, planned[1], plan)  # after a launch that worked
    return result
