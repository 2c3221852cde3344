"""The launch of one decided call: a LaunchPlan holds what the call's pointers do not change (the
route's C launcher, a KdaArgs template with the shapes, modes and the route's plan, the workspace
size); ``LaunchPlan.launch`` fills in the pointers and launches on the current stream."""

from __future__ import annotations

import ctypes
import functools

import torch

from kdactl.faults import is_active
from kdactl.kda.call import PrefillCall
from kdactl.kda.device import current_stream_ptr, kernels
from kdactl.kda.fused import NONE, Fused
from kdactl.kda.problem import DTYPE_CODES, KdaProblem
from kdactl.kda.routes import ROUTE_TABLE, DeviceInfo
from kdactl.kda.tuning import AUTO, Tuning
from kdactl.kda.workspace import KdaWorkspace
from kdactl.kernel_abi import LEADING_POINTERS, KdaArgs


def args_template(p: KdaProblem, device: DeviceInfo, route_id: int, scale: float, tuning: Tuning = AUTO,
                  fused: Fused = NONE, cu_seqlens_int32: bool = False, checkpoint_dtype: int = 0) -> KdaArgs:  # fmt: skip
    """A call's KdaArgs without its pointers (every one NULL): the shapes, element types, modes,
    tuning fields and the route's plan for this device."""
    return KdaArgs(
        qk_heads=p.qk_heads, qk_l2norm=int(fused.qk_l2norm), beta_mode=fused.beta_mode, gate_mode=fused.gate_mode,
        lower_bound=fused.lower_bound, batch=p.num_seqs, seqlen=p.seqlen, heads=p.heads, key_dim=p.key_dim,
        value_dim=p.value_dim, g_dtype=p.g_dtype, beta_dtype=p.beta_dtype, qkv_fp16=int(p.qkv_fp16),
        state_v_first=int(p.state_v_first), checkpoint_every=p.checkpoint_every, checkpoint_dtype=checkpoint_dtype,
        cu_seqlens_is_int32=int(cu_seqlens_int32), varlen=int(p.varlen), tuning_warps=tuning.warps,
        tuning_stages=tuning.stages, scale=scale, segment_chunks=ROUTE_TABLE[route_id].segment_chunks(p, device),
    )  # fmt: skip


class LaunchPlan:
    """What a launch needs that the call's pointers do not change: the route's kernel, a KdaArgs
    template with the shapes, modes and the route's plan filled in (every pointer NULL), and the
    workspace size. Built once per call shape; ``launch`` fills in the pointers and launches."""

    __slots__ = ("route_id", "kernel", "address", "template", "need", "device_index", "slow", "what")

    def __init__(self, p: KdaProblem, device: DeviceInfo, route_id: int, device_index: int, scale: float,
                 tuning: Tuning = AUTO, fused: Fused = NONE, cu_seqlens_int32: bool = False, checkpoint_dtype: int = 0):  # fmt: skip

        lib = kernels()
        self.route_id, self.device_index = route_id, device_index
        self.template = args_template(p, device, route_id, scale, tuning, fused, cu_seqlens_int32, checkpoint_dtype)
        self.need = lib.workspace_bytes(route_id, self.template)  # reads no pointer
        self.kernel = lib.kda_route(ROUTE_TABLE[route_id].name)
        self.address = ctypes.cast(self.kernel, ctypes.c_void_p).value  # what kdactl_host calls
        self.slow = slow_fault()
        self.what = f"KDA prefill route {ROUTE_TABLE[route_id].name!r}"

    @classmethod
    def of(cls, p: KdaProblem, device: DeviceInfo, route_id: int, call: PrefillCall) -> LaunchPlan:
        """The plan for a validated call: q's device, cu_seqlens' and the checkpoints' element types."""
        return cls(p, device, route_id, call.q.device.index, call.scale, call.tuning, call.fused,
                   call.cu_seqlens is not None and call.cu_seqlens.dtype == torch.int32,
                   DTYPE_CODES[call.checkpoints.dtype] if call.checkpoints is not None else 0)  # fmt: skip

    def launch(self, call: PrefillCall, o, final_state, stream: int | None = None) -> None:
        """Launch a call on the current stream (``stream``: its raw pointer, when the caller has it)
        with its outputs ``o`` and ``final_state`` (a state pool is both its initial and final state).
        ``call.workspace``: a claimed KdaWorkspace, a uint8 scratch tensor, or None (scratch is then
        allocated here when the route needs it). Every line here runs on every call."""
        # One unpacking of the whole call (a tuple, every field named): cheaper than reading its fields one by one.
        (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, state_pool, state_indices, _out, _cu_seqlens_cpu,
         workspace, _scale, _output_final_state, _route, _tuning, _fused, _state_v_first, _checkpoint_every,
         checkpoints, _checkpoint_dtype) = call  # fmt: skip
        if state_pool is not None:
            initial_state = state_pool
        args = self.template.__class__.from_buffer_copy(self.template)
        # KdaArgs starts with the LEADING_POINTERS, in this order: one write sets them all (ctypes takes
        # any sequence; its stubs say list, and a list would be one more object on every call).
        _POINTERS.from_buffer(args)[:] = (  # type: ignore[call-overload]
            q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
            initial_state.data_ptr() if initial_state is not None else 0, o.data_ptr(),
            final_state.data_ptr() if final_state is not None else 0,
            cu_seqlens.data_ptr() if cu_seqlens is not None else 0)  # fmt: skip
        if A_log is not None or dt_bias is not None or state_indices is not None or checkpoints is not None:
            for name, x in (("A_log", A_log), ("dt_bias", dt_bias), ("state_indices", state_indices),
                            ("checkpoints", checkpoints)):  # fmt: skip
                if x is not None:
                    setattr(args, name, x.data_ptr())
        if self.need:
            scratch = workspace.reserve(self.need) if isinstance(workspace, KdaWorkspace) else workspace
            if scratch is None or scratch.numel() < self.need:
                scratch = torch.empty(self.need, dtype=torch.uint8, device=q.device)
            args.workspace, args.workspace_bytes = scratch.data_ptr(), scratch.numel()
        if stream is None:
            stream = current_stream_ptr(q.device)
        if self.device_index == torch._C._cuda_getDevice():
            if self.slow:
                self.launch_into_spares(args, stream, o, final_state, checkpoints)
            self.check(self.kernel(ctypes.byref(args), stream))
        else:
            with torch.cuda.device(self.device_index):
                if self.slow:
                    self.launch_into_spares(args, stream, o, final_state, checkpoints)
                self.check(self.kernel(ctypes.byref(args), stream))

    def launch_into_spares(self, args: KdaArgs, stream: int, o, final_state, checkpoints) -> None:
        """KDACTL_FAULT=slow: the same launch once more, before the real one, with every output in
        a spare copy: the call takes twice the device time and its results are the ones of one
        launch (a state pool or state updated in place is read by the real launch as the caller
        left it; the spare launch reads it too, and writes only its spares)."""
        spare_args = KdaArgs.from_buffer_copy(args)
        spares = []  # alive until the launch is queued; the allocator orders their reuse on this stream
        for name, x in (("o", o), ("final_state", final_state), ("checkpoints", checkpoints)):
            if x is not None:
                spares.append(torch.empty_like(x))
                setattr(spare_args, name, spares[-1].data_ptr())
        self.check(self.kernel(ctypes.byref(spare_args), stream))

    def check(self, rc: int) -> None:
        """Raise the error the launcher's return code names (kdactl.jit.library.Kernels.check)."""
        if rc:
            kernels().check(rc, self.what)


_POINTERS = ctypes.c_void_p * len(LEADING_POINTERS)  # KdaArgs' first fields


@functools.cache
def slow_fault() -> bool:
    """Whether KDACTL_FAULT=slow asks every launch to take twice the device time (same results: the
    perf gate must fail the node, and nothing before it). Read once per process: the launch path
    stays free of environment lookups."""
    return is_active("slow")
