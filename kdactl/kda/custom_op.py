"""The torch custom op around the kernel library's C ABI, for calls that torch.compile traces.

``kdactl::kda_prefill_`` mutates its preallocated outputs and returns nothing, so CUDA graph capture
records one launch on torch's current stream and torch.compile sees one opaque op. An eager prefill
launches directly (kdactl.kda.launch): torch's dispatch costs more host time than the launch.
"""

from __future__ import annotations

import torch

from kdactl.kda.call import PrefillCall
from kdactl.kda.device import device_info
from kdactl.kda.fused import Fused
from kdactl.kda.launch import LaunchPlan
from kdactl.kda.problem import KdaProblem
from kdactl.kda.routes import decide_route
from kdactl.kda.tuning import Tuning

UNDECIDED = -1  # route_id of a call traced by torch.compile: the op decides the route when it runs


@torch.library.custom_op("kdactl::kda_prefill_", mutates_args=("o", "final_state", "workspace"), device_types="cuda")
def kda_prefill_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    o: torch.Tensor,
    final_state: torch.Tensor | None,
    workspace: torch.Tensor | None,
    scale: float,
    route: str,
    route_id: int,
    tuning_warps: int,
    tuning_stages: int,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    qk_l2norm: bool = False,
    beta_mode: int = 0,
    gate_mode: int = 0,
    lower_bound: float = 0.0,
    state_v_first: bool = False,
) -> None:
    """Launch route ``route_id`` (an id of ROUTE_TABLE) on the current stream: kdactl.kda.prefill
    validated the inputs and decided it. A call that torch.compile traced passes UNDECIDED instead
    (tracing reads no pointers and no device facts): the request ``route`` is decided here, and the
    pointer checks the trace skipped are repeated here for every call.
    ``workspace`` is a uint8 scratch buffer; one is allocated here when it is missing or too small."""
    call = PrefillCall(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, workspace=workspace, scale=scale,
                       route=route, tuning=Tuning(tuning_warps, tuning_stages), fused=Fused(qk_l2norm, beta_mode, gate_mode, lower_bound),
                       state_v_first=state_v_first)  # fmt: skip
    tensors = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   o=o, final_state=final_state, A_log=A_log, dt_bias=dt_bias)  # fmt: skip
    for name, t in tensors.items():
        if t is not None and t.numel() and t.data_ptr() % 16:
            raise ValueError(f"kdactl.kda.prefill: {name} must be 16-byte aligned")
    problem = KdaProblem.of(q, v, g, beta, cu_seqlens, state_v_first)
    device = device_info(q.device)
    if route_id == UNDECIDED:
        route_id = decide_route(problem, device, route).id
    LaunchPlan.of(problem, device, route_id, call).launch(call, o, final_state)


def traced_prefill(call: PrefillCall, o, final_state) -> None:
    """A validated call that torch.compile traces: the op, with the call's tensors and options."""
    scratch = call.workspace.buffer if call.workspace is not None else None
    fused = call.fused
    kda_prefill_(call.q, call.k, call.v, call.g, call.beta, call.initial_state, call.cu_seqlens, o, final_state,
                 scratch, call.scale, call.route, UNDECIDED, call.tuning.warps, call.tuning.stages, call.A_log, call.dt_bias,
                 fused.qk_l2norm, fused.beta_mode, fused.gate_mode, float(fused.lower_bound),
                 bool(call.state_v_first))  # fmt: skip


@kda_prefill_.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, o, final_state, workspace, scale, route, route_id, tuning_warps,
      tuning_stages, A_log=None, dt_bias=None, qk_l2norm=False, beta_mode=0, gate_mode=0, lower_bound=0.0,
      state_v_first=False) -> None:  # fmt: skip
    return None
