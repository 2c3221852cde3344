"""The facts about one KDA prefill call that route selection and launching need: plain data, no tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdactl.kernel_abi import DTYPE_BF16, DTYPE_FP16, DTYPE_FP32

KEY_DIMS = (64, 128)
VALUE_DIMS = (64, 128)
QKV_DTYPES = (torch.bfloat16, torch.float16)  # the kernels' q, k, v and o
GATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # g and beta
DTYPE_CODES = {torch.float32: DTYPE_FP32, torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_FP16}


@dataclass(frozen=True)
class KdaProblem:
    """The facts about one call that route selection and launching need: plain data, no tensors."""

    batch: int  # B of the tensors (1 for varlen)
    seqlen: int  # T of the tensors (total tokens for varlen)
    heads: int
    key_dim: int
    value_dim: int
    num_seqs: int  # N: B for fixed batches, len(cu_seqlens) - 1 for varlen
    varlen: bool
    g_dtype: int  # kdactl.kernel_abi.DTYPE_* of g
    beta_dtype: int  # and of beta
    qk_heads: int = 0  # heads of q and k when fewer than ``heads`` (GVA); 0: the same
    state_pool: bool = False  # states come from, and go back to, slots of one pool (state_indices)
    qkv_fp16: bool = False  # q, k, v and o are fp16 (else bf16)
    state_v_first: bool = False  # every state is [V, K] per head (else [K, V])
    checkpoint_every: int = 0  # tokens between prefix checkpoints; 0: none

    @classmethod
    def of(cls, q, v, g, beta, cu_seqlens=None, state_v_first=False) -> KdaProblem:
        """The facts of already-validated tensors (``heads``: v's, the value heads)."""
        B, T, Hq, K = q.shape
        H = v.shape[2]
        num_seqs = cu_seqlens.numel() - 1 if cu_seqlens is not None else B
        return cls(B, T, H, K, v.shape[-1], num_seqs, cu_seqlens is not None, DTYPE_CODES[g.dtype],
                   DTYPE_CODES[beta.dtype], 0 if Hq == H else Hq, qkv_fp16=q.dtype == torch.float16,
                   state_v_first=bool(state_v_first))  # fmt: skip

    @property
    def state_shape(self) -> tuple[int, int]:
        """One head's state: (K, V), or (V, K) V-first."""
        return (self.value_dim, self.key_dim) if self.state_v_first else (self.key_dim, self.value_dim)
