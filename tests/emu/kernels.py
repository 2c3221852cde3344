"""Calls the emulated kernel library (tests/emu/build.py) on CPU tensors, through the same C ABI and
the same route plans as kdactl.kda.launch: its KdaArgs template with the tensors' pointers, the
route's workspace, the route's launcher. One library copy per emulated device (SM count and shared
memory per block, which the library reads once per process and plans its grids and rings by) and
schedule (the order in which threads run between barriers: FORWARD, REVERSE, WARP_AHEAD, a seed)."""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
from pathlib import Path

import torch

from kdactl.kda.fused import NONE, Fused
from kdactl.kda.launch import args_template
from kdactl.kda.problem import DTYPE_CODES, KdaProblem
from kdactl.kda.routes import DeviceInfo
from kdactl.kda.tuning import AUTO, Tuning
from kdactl.kda.validation import validate_checkpoints
from kdactl.kernel_abi import ROUTE_IDS, KdaArgs

GUARD = 4096  # bytes of 0xff (NaN in every float type) on either side of each buffer a call gets


class Guards:
    """Copies of a call's buffers, each in the middle of a buffer of 0xff bytes (NaN in every float
    type): a read past either end brings NaN (or -1) into the call; a write there shows in `broken`."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def put(self, name: str, x: torch.Tensor | None) -> torch.Tensor | None:
        if x is None:
            return None
        x = x.contiguous()
        nbytes = x.numel() * x.element_size()
        buf = torch.full((GUARD + nbytes + GUARD,), 0xFF, dtype=torch.uint8)
        view = buf[GUARD : GUARD + nbytes].view(x.dtype).view(x.shape)
        view.copy_(x)
        self.buffers[name] = buf
        return view

    def broken(self) -> list[str]:
        """The buffers whose guards were written."""
        return [n for n, b in self.buffers.items() if not ((b[:GUARD] == 0xFF).all() and (b[-GUARD:] == 0xFF).all())]


# Orders of threads between barriers (tests/emu/runtime.cpp): by index, reversed, shuffled from a
# seed >= 2, or by index with each warp running on alone up to a barrier of the block (WARP_AHEAD;
# elsewhere warps keep step at their collectives). A kernel free of races computes the same bits under each.
FORWARD, REVERSE, WARP_AHEAD = 0, 1, -1
SHUFFLED = 7  # the threads released together run in an order shuffled from seed 7
EVERY_ORDER = (FORWARD, REVERSE, SHUFFLED, WARP_AHEAD)  # what the thread-order checks compare
H200_SMEM_OPTIN = 232448  # shared memory per block with the attribute: 227 KB (sm_90, sm_100)
SMALL_SMEM_OPTIN = 101376  # 99 KB: sm_86, sm_89, sm_120


class EmulatedKernels:
    """The emulated library of one SM count, schedule and shared memory per block."""

    def __init__(self, library: Path, sms: int = 132, schedule: int = FORWARD, smem_optin: int = H200_SMEM_OPTIN):
        copy = library.with_name(f"{library.stem}-sms{sms}-schedule{schedule}-smem{smem_optin}.so")
        if not copy.exists():
            tmp = copy.with_suffix(".tmp")
            shutil.copy(library, tmp)
            tmp.rename(copy)
        self.lib = ctypes.CDLL(str(copy))
        self.lib.kdactl_emu_configure(ctypes.c_int(sms), ctypes.c_int(schedule), ctypes.c_int(smem_optin))
        self.lib.kdactl_kda_workspace_bytes.argtypes = [ctypes.POINTER(KdaArgs), ctypes.c_int,
                                                        ctypes.POINTER(ctypes.c_uint64)]  # fmt: skip
        self.lib.kdactl_error_string.restype = ctypes.c_char_p
        self.device = DeviceInfo(sms, (9, 0), "sm_90a")
        self.workspace: torch.Tensor | None = None  # the last call's
        self.args: KdaArgs | None = None  # the last call's

    def workspace_bytes(self, route_id: int, args: KdaArgs) -> int:
        need = ctypes.c_uint64()
        rc = self.lib.kdactl_kda_workspace_bytes(ctypes.byref(args), route_id, ctypes.byref(need))
        if rc:
            raise RuntimeError(f"workspace_bytes: {self.lib.kdactl_error_string(rc).decode()}")
        return need.value

    def run(self, route: str, q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
            fused: Fused = NONE, A_log=None, dt_bias=None, state_v_first=False, tuning: Tuning = AUTO,
            state_indices=None, checkpoint_every=0, checkpoint_dtype=torch.float32, segment_chunks=None,
            entry=None, workspace_byte=0xFF, workspace_from=None):  # fmt: skip
        """(o, final state) of one call of ``route`` on contiguous CPU tensors shaped as kdactl.kda's
        (q, k [B,T,Hq,K], v [B,T,H,V], g [B,T,H,K], beta [B,T,H]); with ``state_indices`` the
        initial state is a pool, updated in place and returned as the final state; with
        ``checkpoint_every`` a third item, every sequence's state before tokens 0, C, 2C, ...,
        sequence after sequence ([rows, H, *state]). ``segment_chunks`` replaces route small_bh's
        plan; ``entry`` names another exported launcher of the route's signature to call with the
        route's arguments and workspace (tools/fused_probe.cu's), whose bytes start as
        ``workspace_byte`` (0xff: NaN, so that a read before a write shows), or as ``workspace_from``'s
        (a copy: an earlier call's ``workspace``, for launchers that take a pass's work from another's).
        Raises RuntimeError with the library's message when the launcher returns an error."""
        p = dataclasses.replace(
            KdaProblem.of(q, v, g, beta, cu_seqlens, state_v_first), checkpoint_every=checkpoint_every
        )
        route_id = ROUTE_IDS[route]
        K = q.shape[-1]
        args = args_template(p, self.device, route_id, K**-0.5 if scale is None else scale, tuning, fused,
                             cu_seqlens is not None and cu_seqlens.dtype == torch.int32,
                             DTYPE_CODES[checkpoint_dtype] if checkpoint_every else 0)  # fmt: skip
        if segment_chunks is not None:
            args.segment_chunks = segment_chunks
        pool = initial_state if state_indices is not None else None
        checkpoints = None
        if checkpoint_every:  # kdactl.kda's buffer, [B or 1, rows, H, *state], sequence after sequence
            host_cu = cu_seqlens.tolist() if cu_seqlens is not None else None
            checkpoints = validate_checkpoints(checkpoint_every, None, p, "cpu", cu_seqlens, host_cu,
                                               dtype=checkpoint_dtype, require_cuda=False).flatten(0, 1)  # fmt: skip
        # Every buffer the call reads or writes sits between guards (what a read or write past it does shows).
        guards = Guards()
        q, k, v, g, beta = (guards.put(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
        initial_state, cu_seqlens, A_log, dt_bias, state_indices = (
            guards.put(n, x) for n, x in (("initial_state", initial_state), ("cu_seqlens", cu_seqlens),
                                          ("A_log", A_log), ("dt_bias", dt_bias), ("state_indices", state_indices))
        )  # fmt: skip
        o = guards.put("o", torch.full_like(v, float("nan")))
        final = initial_state if pool is not None else guards.put("final_state", torch.full(
            (p.num_seqs, p.heads, *p.state_shape), float("nan")))  # fmt: skip
        if checkpoints is not None:
            checkpoints = guards.put("checkpoints", checkpoints.fill_(float("nan")))
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("o", o), ("final_state", final),
                        ("initial_state", initial_state), ("cu_seqlens", cu_seqlens), ("A_log", A_log),
                        ("dt_bias", dt_bias), ("state_indices", state_indices), ("checkpoints", checkpoints)):  # fmt: skip
            if x is not None:
                setattr(args, name, x.data_ptr())
        need = self.workspace_bytes(route_id, args)
        # NaN bytes: a workspace read before the route writes it shows in the outputs
        start = torch.full((max(need, 1),), workspace_byte, dtype=torch.uint8)
        if workspace_from is not None:
            if workspace_from.numel() != start.numel():
                raise ValueError(f"workspace_from has {workspace_from.numel()} bytes, the call needs {start.numel()}")
            start.copy_(workspace_from)
        workspace = guards.put("workspace", start)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), need
        self.workspace, self.args = workspace, args  # what the call left there and ran with, for tests to read
        launcher = getattr(self.lib, entry or f"kdactl_kda_{route}")
        launcher.argtypes = [ctypes.POINTER(KdaArgs), ctypes.c_void_p]
        rc = launcher(ctypes.byref(args), None)
        if rc:
            raise RuntimeError(f"route {route}: {self.lib.kdactl_error_string(rc).decode()} (code {rc})")
        outside = guards.broken()
        if outside:
            raise RuntimeError(f"route {route} wrote past the ends of {', '.join(outside)}")
        if pool is not None:
            pool.copy_(final)  # the caller's pool, updated in place as on the GPU
            final = pool
        return (o, final) if checkpoints is None else (o, final, checkpoints)
