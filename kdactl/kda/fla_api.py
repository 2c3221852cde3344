"""``kdactl.kda.chunk_kda``: flash-linear-attention 0.6.0's ``chunk_kda`` signature and forward
semantics over kdactl's kernels, for the serving engines that call fla's (vLLM, SGLang).

Inference only: no gradients. fla's fused options map onto kdactl.kda.fused, which the kernels
apply where they load their inputs; grouped values (v with a multiple of q's heads) as fla's GVA.
q, k, v bf16 or fp16 are read as they are; fp32 q, k, v are accepted and rounded to bf16, the
precision the kernels read (o is returned in fp32). state_v_first and return_intermediate_states
(the state before every chunk_size tokens, bf16, fla's layout) are kdactl.kda.prefill's
state_v_first and checkpoints. What fla accepts and kdactl does not do raises ValueError naming it,
never a silent difference: context parallelism.
fla's own rules are kept: allow_neg_eigval needs use_beta_sigmoid_in_kernel, the gate needs A_log
or lower_bound, safe_gate with the gate needs lower_bound in [-5, 0), chunk_size is 32 or 64
(a tiling choice there, none here). A_log and dt_bias are read only with use_gate_in_kernel, as fla.
"""

from __future__ import annotations

import torch

from kdactl.kda.api import prefill
from kdactl.kda.fused import BETA_AS_GIVEN, BETA_SIGMOID, BETA_SIGMOID2, GATE_LOWER_BOUND, GATE_SOFTPLUS, Fused

_NAME = "kdactl.kda.chunk_kda"
_ACCEPTED_KWARGS = {"A_log", "dt_bias", "chunk_size", "transpose_state_layout"}


def _refuse(what: str) -> ValueError:
    return ValueError(f"{_NAME}: {what}")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):  # fmt: skip
    """fla's ``chunk_kda(...)`` forward: returns ``(o, final_state or None)``, o in q's dtype, and
    fla's intermediate states h as a third item with return_intermediate_states."""
    unknown = sorted(set(kwargs) - _ACCEPTED_KWARGS)
    if unknown:
        raise _refuse(f"unsupported arguments {unknown}")
    if "transpose_state_layout" in kwargs:  # fla's deprecated name
        if state_v_first:
            raise _refuse("pass state_v_first or the deprecated transpose_state_layout, not both")
        state_v_first = kwargs["transpose_state_layout"]
    if cp_context is not None:
        raise _refuse("cp_context (context parallelism) is not supported")
    if kwargs.get("chunk_size", 64) not in (32, 64):
        raise _refuse(
            f"`chunk_size` must be either 32 or 64, got {kwargs['chunk_size']}"
        )  # fla's words: its tests match them
    if use_graph and max_num_seqs is not None and (cu_seqlens is None or max_num_seqs != cu_seqlens.numel() - 1):
        raise _refuse("max_num_seqs must equal len(cu_seqlens) - 1 (pad cu_seqlens with empty sequences)")
    if return_intermediate_states and disable_recompute:
        raise _refuse("return_intermediate_states must be used with disable_recompute=False")
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v, g, beta)):
        raise _refuse("computes no gradients (inference only): call it under torch.no_grad() or inference_mode()")
    fused, A_log, dt_bias = _fused(use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                                   allow_neg_eigval, safe_gate, lower_bound, kwargs)  # fmt: skip
    fp32 = all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in (q, k, v))
    if fp32:  # the kernels read 16-bit q, k, v
        q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    every = kwargs.get("chunk_size", 64) if return_intermediate_states else None  # fla: the state before each chunk
    out = prefill(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, fused=fused, A_log=A_log, dt_bias=dt_bias,
                  state_v_first=state_v_first, checkpoint_every=every,
                  checkpoint_dtype=torch.bfloat16 if every else None)  # fmt: skip
    if fp32:
        out = (out[0].float(), *out[1:])
    return out


def _fused(l2norm, gate, beta_sigmoid, neg_eigval, safe_gate, lower_bound, kwargs):
    """(Fused, A_log, dt_bias) for fla's flags, with fla's own argument rules."""
    if neg_eigval and not beta_sigmoid:
        raise _refuse("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True")
    beta_mode = (BETA_SIGMOID2 if neg_eigval else BETA_SIGMOID) if beta_sigmoid else BETA_AS_GIVEN
    if not gate:
        return Fused(bool(l2norm), beta_mode), None, None
    A_log, dt_bias = (_fp32(kwargs.get(name)) for name in ("A_log", "dt_bias"))
    if A_log is None and lower_bound is None:
        raise _refuse("A_log must be provided when use_gate_in_kernel=True and lower_bound is not set")
    if safe_gate and (lower_bound is None or not -5 <= lower_bound < 0):
        raise _refuse(f"safe_gate with use_gate_in_kernel needs lower_bound in [-5, 0), got {lower_bound}")
    gate_mode = GATE_LOWER_BOUND if lower_bound is not None else GATE_SOFTPLUS
    bound = float(lower_bound) if lower_bound is not None else 0.0
    return Fused(bool(l2norm), beta_mode, gate_mode, bound), A_log, dt_bias


def _fp32(x):
    """The gate's small parameter tensors flat and in fp32, as fla's kernels load them (exact for
    bf16/fp16; fla's tests give A_log as [1, 1, H, 1])."""
    if not isinstance(x, torch.Tensor):
        return x
    x = x.float() if x.dtype != torch.float32 else x
    return x.reshape(-1) if x.is_contiguous() else x
