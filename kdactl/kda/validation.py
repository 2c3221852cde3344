"""Input validation for KDA prefill: every bad argument raises ValueError naming it, before any launch.

The checks read shapes, dtypes, devices and strides; cu_seqlens values are read back from the device
only outside CUDA graph capture (a capture cannot synchronize), where they are the caller's contract.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kdactl.kda.call import PrefillCall
from kdactl.kda.device import capturing
from kdactl.kda.fused import NONE, Fused
from kdactl.kda.problem import GATE_DTYPES, KEY_DIMS, QKV_DTYPES, VALUE_DIMS, KdaProblem
from kdactl.kda.tuning import Tuning
from kdactl.kernel_abi import CHUNK, GATE_SOFTPLUS, MAX_GRID_DIM


def _fail(name: str, what: str) -> ValueError:
    return ValueError(f"kdactl.kda.prefill: {name} {what}")


def _check_tensor(name, x, dtypes, ndim, device=None, require_cuda=True, runtime=True):
    """dtype, dimensions (``ndim`` None: any), device, contiguity, alignment."""
    if not isinstance(x, torch.Tensor):
        raise _fail(name, f"must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        names = [str(d).replace("torch.", "") for d in dtypes]
        want = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise _fail(name, f"must be {want}, got {str(x.dtype).replace('torch.', '')}")
    if ndim is not None and x.dim() != ndim:
        raise _fail(name, f"must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if require_cuda and x.device.type != "cuda":
        raise _fail(name, f"must be on a CUDA device, got {x.device}")
    if device is not None and x.device != device:
        raise _fail(name, f"must be on {device} like q, got {x.device}")
    if not x.is_contiguous():
        raise _fail(name, f"must be contiguous, got strides {x.stride()} for shape {tuple(x.shape)}")
    if runtime and x.numel() and x.data_ptr() % 16:
        raise _fail(name, "must be 16-byte aligned (a view at an odd offset? pass .clone())")


def _check_shape(name, x, shape):
    if tuple(x.shape) != tuple(shape):
        raise _fail(name, f"must have shape {tuple(shape)} to match q/v, got {tuple(x.shape)}")


def validate_call(
    call: PrefillCall, *, runtime: bool = True, require_cuda: bool = True
) -> tuple[KdaProblem, PrefillCall]:
    """Check every argument of a call; (its problem, the call with what validation settled: fused,
    scale and the checkpoints buffer). ``runtime=False``: under torch.compile tracing (the op
    repeats the pointer checks when it runs)."""
    c = call
    problem = validate(c.q, c.k, c.v, c.g, c.beta, c.scale, c.initial_state, c.cu_seqlens, cu_seqlens_cpu=c.cu_seqlens_cpu,
                       require_cuda=require_cuda, runtime=runtime, state_v_first=c.state_v_first)  # fmt: skip
    fused = NONE if c.fused is None else c.fused
    if not isinstance(fused, Fused):
        raise _fail("fused", f"must be a kdactl.kda.fused.Fused, got {type(fused).__name__}")
    device = c.q.device
    validate_fused(fused, c.A_log, c.dt_bias, problem, device, require_cuda=require_cuda, runtime=runtime)
    if not isinstance(c.tuning, Tuning):
        raise _fail(
            "tuning", f"must be a kdactl.kda.Tuning (e.g. Tuning(warps=8, stages=4)), got {type(c.tuning).__name__}"
        )
    validate_pool(c.state_pool, c.state_indices, problem, device, require_cuda=require_cuda, runtime=runtime)
    if c.state_pool is not None:
        if c.initial_state is not None or c.output_final_state or (isinstance(c.out, tuple) and c.out[1] is not None):
            raise _fail("state_pool", "holds the initial and final states: give no initial_state, "
                                      "output_final_state or final_state buffer with it")  # fmt: skip
        if not runtime:
            raise _fail("state_pool", "is not supported under torch.compile yet")
        problem = dataclasses.replace(problem, state_pool=True)
    checkpoints = c.checkpoints
    if c.checkpoint_every is not None or checkpoints is not None or c.checkpoint_dtype is not None:
        if not runtime:
            raise _fail("checkpoints", "are not supported under torch.compile yet")
        checkpoints = validate_checkpoints(c.checkpoint_every, checkpoints, problem, device, c.cu_seqlens,
                                           c.cu_seqlens_cpu, dtype=c.checkpoint_dtype, require_cuda=require_cuda,
                                           runtime=runtime)  # fmt: skip
        problem = dataclasses.replace(problem, checkpoint_every=c.checkpoint_every)
    scale = problem.key_dim**-0.5 if c.scale is None else float(c.scale)
    return problem, c._replace(fused=fused, scale=scale, checkpoints=checkpoints)


def validate(q, k, v, g, beta, scale, initial_state, cu_seqlens, *, cu_seqlens_cpu=None, require_cuda=True,
             runtime=True, state_v_first=False) -> KdaProblem:  # fmt: skip
    """Check every input; return the problem's plain facts. ``require_cuda=False`` lets CPU tests
    exercise every other rule on CPU tensors; ``runtime=False`` (under torch.compile tracing) skips
    the checks that read pointers or device values, which the op repeats when it runs.
    ``cu_seqlens_cpu``: the caller's host copy of cu_seqlens (as fla's callers keep one); its values
    are checked instead of reading the device tensor back, which would synchronize the device."""
    _check_tensor("q", q, QKV_DTYPES, 4, require_cuda=require_cuda, runtime=runtime)
    dev = q.device

    def check(name, x, dtypes, ndim):
        _check_tensor(name, x, dtypes, ndim, dev, require_cuda, runtime)

    check("k", k, (q.dtype,), 4)  # one element type for q, k and v (and o)
    check("v", v, (q.dtype,), 4)
    check("g", g, GATE_DTYPES, 4)
    check("beta", beta, GATE_DTYPES, 3)
    B, T, Hq, K = q.shape
    H, V = v.shape[2], v.shape[3]  # value heads: Hq of q/k, or a multiple of it (GVA, as fla)
    _check_shape("k", k, q.shape)
    _check_shape("v", v, (B, T, H, V))
    if H % Hq:
        raise _fail("v", f"heads must be a multiple of q's {Hq} heads (grouped values), got {H}")
    _check_shape("g", g, (B, T, H, K))
    _check_shape("beta", beta, (B, T, H))
    if K not in KEY_DIMS:
        raise _fail("q", f"head dim K must be one of {KEY_DIMS}, got {K}")
    if V not in VALUE_DIMS:
        raise _fail("v", f"head dim V must be one of {VALUE_DIMS}, got {V}")
    if not 1 <= H <= MAX_GRID_DIM:
        raise _fail("q", f"heads must be in 1..{MAX_GRID_DIM}, got {H}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise _fail("scale", f"must be a finite number, got {scale!r}")
    if cu_seqlens_cpu is not None and cu_seqlens is None:
        raise _fail("cu_seqlens_cpu", "is given without cu_seqlens (the device tensor the kernels read)")
    host = host_bounds(cu_seqlens_cpu, cu_seqlens) if cu_seqlens_cpu is not None else None
    num_seqs = _check_cu_seqlens(cu_seqlens, B, T, dev, runtime, host) if cu_seqlens is not None else B
    if num_seqs > MAX_GRID_DIM:
        raise _fail(
            "cu_seqlens" if cu_seqlens is not None else "q", f"at most {MAX_GRID_DIM} sequences, got {num_seqs}"
        )
    problem = KdaProblem.of(q, v, g, beta, cu_seqlens, state_v_first)
    if initial_state is not None:
        check("initial_state", initial_state, (torch.float32,), 4)
        _check_shape("initial_state", initial_state, (num_seqs, H, *problem.state_shape))
    return problem


def validate_fused(fused: Fused, A_log, dt_bias, problem: KdaProblem, device, *, require_cuda=True,
                   runtime=True) -> None:  # fmt: skip
    """The gate's parameters: A_log fp32 [H] (required by the softplus gate), dt_bias fp32 [H * K]
    (or [H, K]), both only with a gate computed in the kernels."""
    H, K = problem.heads, problem.key_dim
    if not fused.gated:
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None:
                raise _fail(name, "is given without a gate computed in the kernels (use_gate_in_kernel)")
        return
    if fused.gate_mode == GATE_SOFTPLUS and A_log is None:
        raise _fail("A_log", "is required by the gate -exp(A_log) softplus(g + dt_bias) (or set lower_bound)")
    for name, x, shapes in (("A_log", A_log, ((H,),)), ("dt_bias", dt_bias, ((H * K,), (H, K)))):
        if x is None:
            continue
        _check_tensor(name, x, (torch.float32,), None, device, require_cuda, runtime)  # shapes: below
        if tuple(x.shape) not in shapes:
            raise _fail(
                name, f"must have shape {' or '.join(map(str, shapes))} for {H} heads of K={K}, got {tuple(x.shape)}"
            )


def validate_pool(pool, indices, problem: KdaProblem, device, *, require_cuda=True, runtime=True) -> None:
    """A serving state pool: fp32 [P, H, K, V] and its int32 slot per sequence [N] (negative: start
    from zero, write nothing). Two sequences must not share a slot (they would race); the indices
    stay on the device unread, so that is the caller's contract, as in fla's and vLLM's pools."""
    if (pool is None) != (indices is None):
        raise _fail(
            "state_indices" if pool is not None else "state_pool",
            "is needed with the other (state_pool, state_indices)",
        )
    if pool is None:
        return
    _check_tensor("state_pool", pool, (torch.float32,), 4, device, require_cuda, runtime)
    H, (S1, S2) = problem.heads, problem.state_shape
    if tuple(pool.shape[1:]) != (H, S1, S2) or pool.shape[0] < 1:
        raise _fail("state_pool", f"must have shape (P, {H}, {S1}, {S2}) with P >= 1, got {tuple(pool.shape)}")
    _check_tensor("state_indices", indices, (torch.int32,), 1, device, require_cuda, runtime)
    if indices.numel() != problem.num_seqs:
        raise _fail("state_indices", f"must have one slot per sequence ({problem.num_seqs}), got {indices.numel()}")


def validate_checkpoints(every, buffer, problem: KdaProblem, device, cu_seqlens=None, cu_seqlens_cpu=None, *,
                         dtype=None, require_cuda=True, runtime=True):  # fmt: skip
    """Prefix checkpoints every ``every`` tokens: the caller's buffer, checked, or a new one of
    ``dtype`` (fp32 or bf16; None: fp32).
    Its shape is fla's (return_intermediate_states): [B, rows, H, K, V] (V-first: [.., V, K]), rows
    ceil(T / every); varlen [1, rows, H, ..] with rows the sum of ceil(len_n / every), which the host
    knows from cu_seqlens_cpu or a read-back (a preallocated varlen buffer may have more rows)."""
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0 or every % CHUNK:
        raise _fail("checkpoint_every", f"must be a positive multiple of {CHUNK} tokens, got {every!r}")
    dtypes = (torch.float32, torch.bfloat16)
    if dtype is not None and (buffer is not None or dtype not in dtypes):
        raise _fail(
            "checkpoint_dtype", f"must be float32 or bfloat16, and only without a checkpoints buffer, got {dtype}"
        )
    B, H, (S1, S2) = (1 if problem.varlen else problem.batch), problem.heads, problem.state_shape
    rows = None  # the rows this call writes, when the host knows them
    if not problem.varlen:
        rows = -(-problem.seqlen // every)
    elif cu_seqlens_cpu is not None or (buffer is None and runtime and not capturing(device)):
        bounds = host_bounds(cu_seqlens_cpu, cu_seqlens) if cu_seqlens_cpu is not None else cu_seqlens.tolist()
        rows = sum(-(-(b1 - b0) // every) for b0, b1 in zip(bounds, bounds[1:]))
    if buffer is None:
        if rows is None:
            raise _fail("checkpoints", "must be preallocated under CUDA graph capture without cu_seqlens_cpu "
                                       "(its rows depend on the sequence lengths)")  # fmt: skip
        return torch.empty((B, rows, H, S1, S2), dtype=dtype or torch.float32, device=device)
    _check_tensor("checkpoints", buffer, dtypes, 5, device, require_cuda, runtime)
    shape = tuple(buffer.shape)
    if shape[0] != B or shape[2:] != (H, S1, S2) or (rows is not None and not problem.varlen and shape[1] != rows):
        want = f"({B}, {rows if not problem.varlen else 'rows'}, {H}, {S1}, {S2})"
        raise _fail("checkpoints", f"must have shape {want}, got {shape}")
    if rows is not None and shape[1] < rows:
        raise _fail("checkpoints", f"has {shape[1]} rows, these sequences need {rows} (every {every} tokens)")
    return buffer


def host_bounds(cu_cpu, cu) -> list[int]:
    """The host copy's values: a list of ints, or a CPU int tensor, with as many entries as cu_seqlens."""
    if isinstance(cu_cpu, torch.Tensor):
        if cu_cpu.device.type != "cpu" or cu_cpu.dtype not in (torch.int32, torch.int64) or cu_cpu.dim() != 1:
            raise _fail("cu_seqlens_cpu", f"must be a 1-D int32/int64 CPU tensor or a list of ints, got "
                                          f"{cu_cpu.dtype} {tuple(cu_cpu.shape)} on {cu_cpu.device}")  # fmt: skip
        bounds = cu_cpu.tolist()  # a CPU tensor: no device synchronization
    elif isinstance(cu_cpu, (list, tuple)) and all(isinstance(b, int) and not isinstance(b, bool) for b in cu_cpu):
        bounds = list(cu_cpu)
    else:
        raise _fail("cu_seqlens_cpu", f"must be a list of ints or a CPU int tensor, got {type(cu_cpu).__name__}")
    if isinstance(cu, torch.Tensor) and len(bounds) != cu.numel():
        raise _fail("cu_seqlens_cpu", f"must have {cu.numel()} entries like cu_seqlens, got {len(bounds)}")
    return bounds


def _check_cu_seqlens(cu, B, T, dev, runtime=True, host=None) -> int:
    if not isinstance(cu, torch.Tensor) or cu.dtype not in (torch.int32, torch.int64):
        raise _fail("cu_seqlens", f"must be an int32 or int64 tensor, got {getattr(cu, 'dtype', type(cu).__name__)}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise _fail("cu_seqlens", f"must be 1-D with N+1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != dev:
        raise _fail("cu_seqlens", f"must be on {dev} like q, got {cu.device}")
    if not cu.is_contiguous():
        raise _fail("cu_seqlens", "must be contiguous")
    if B != 1:
        raise _fail("q", f"batch must be 1 when cu_seqlens is given (varlen packs sequences along T), got B={B}")
    if host is not None or (runtime and not capturing(dev)):
        check_bounds(host if host is not None else cu.tolist(), T)  # the device read synchronizes: pass cu_seqlens_cpu
    return cu.numel() - 1


def check_bounds(bounds: list[int], T: int) -> None:
    """cu_seqlens' values (as a host list): from 0 to T, non-decreasing."""
    if bounds[0] != 0:
        raise _fail("cu_seqlens", f"must start at 0, got {bounds[0]}")
    if bounds[-1] != T:
        raise _fail("cu_seqlens", f"must end at T={T}, got {bounds[-1]}")
    bad = next((i for i in range(len(bounds) - 1) if bounds[i + 1] < bounds[i]), None)
    if bad is not None:
        raise _fail("cu_seqlens", f"must be non-decreasing, got {bounds[bad]} then {bounds[bad + 1]} at index {bad}")
