"""Random KDA inputs shared by the CPU and GPU tests (realistic ranges: normalized k, decaying g)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def make_inputs(B, T, H, K=128, V=128, *, device="cpu", g_dtype=torch.float32, beta_dtype=torch.float32,
                state_n=None, g_range=(-1.0, 0.0), seed=0):  # fmt: skip
    """q, k, v (bf16), g (log-decay in g_range), beta in (0,1), and an fp32 initial state for state_n seqs."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    lo, hi = g_range
    g = lo + (hi - lo) * torch.rand(B, T, H, K, generator=gen)
    beta = torch.rand(B, T, H, generator=gen).sigmoid()
    s0 = None if state_n is None else torch.randn(state_n, H, K, V, generator=gen) * 0.5
    to = lambda x, dt: x.to(device=device, dtype=dt)  # noqa: E731
    out = dict(q=to(q, torch.bfloat16), k=to(k, torch.bfloat16), v=to(v, torch.bfloat16),
               g=to(g, g_dtype), beta=to(beta, beta_dtype))  # fmt: skip
    return out, (None if s0 is None else s0.to(device))


def cu_seqlens_of(lengths, device="cpu", dtype=torch.int32):
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return torch.tensor(bounds, dtype=dtype, device=device)
