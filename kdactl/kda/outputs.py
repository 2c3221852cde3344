"""prefill's outputs: o and the final state, taken from the caller's ``out`` (checked: dtype, shape,
device, contiguity, alignment) or allocated."""

from __future__ import annotations

import torch

from kdactl.kda.problem import KdaProblem


def outputs(out, q, v, problem: KdaProblem, output_final_state: bool, eager: bool = True, check: bool = True):
    """(o, final_state or None): taken from ``out`` when given (checked, unless ``check`` is off: a
    planned call's ``out`` has the metadata its plan was validated with), else allocated."""
    o, state = (out if isinstance(out, tuple) else (out, None)) if out is not None else (None, None)
    if o is None:
        o = torch.empty(tuple(v.shape), dtype=q.dtype, device=q.device)
    elif check:
        _check_out("out[0]" if isinstance(out, tuple) else "out", o, tuple(v.shape), q.dtype, q.device, eager)
    if not output_final_state:
        if state is not None:
            raise ValueError("kdactl.kda.prefill: out gives a final_state buffer but output_final_state=False")
        return o, None
    s_shape = (problem.num_seqs, problem.heads, *problem.state_shape)
    if state is None:
        state = torch.empty(s_shape, dtype=torch.float32, device=q.device)
    elif check:
        _check_out("out[1]", state, s_shape, torch.float32, q.device, eager)
    return o, state


def _check_out(name, x, shape, dtype, device, eager=True):
    if not isinstance(x, torch.Tensor) or x.dtype != dtype or tuple(x.shape) != shape:
        got = f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}"
        raise ValueError(f"kdactl.kda.prefill: {name} must be {dtype} of shape {shape}, got {got}")
    if x.device != device or not x.is_contiguous() or (eager and x.data_ptr() % 16):
        raise ValueError(f"kdactl.kda.prefill: {name} must be contiguous, 16-byte aligned, on {device}")
