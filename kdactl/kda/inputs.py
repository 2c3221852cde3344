"""Random KDA problems for smokes, benchmarks and tests: one generator, realistic ranges
(L2-normalized k, decaying log-space g, beta in (0, 1))."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def random_inputs(B: int, T: int, H: int, K: int = 128, V: int = 128, *, lengths: Sequence[int] | None = None,
                  device="cpu", seed: int = 0, g_range: tuple[float, float] | None = (-1.0, 0.0),
                  g_dtype=torch.float32, beta_dtype=torch.float32, with_state: bool = False,
                  normalize_q: bool = False, cu_dtype=torch.int32):  # fmt: skip
    """(inputs {q,k,v,g,beta}, initial_state or None, cu_seqlens or None).

    ``lengths`` makes a varlen batch (B = 1, T = sum(lengths)). ``g_range`` draws g uniformly in
    [lo, hi]; None draws logsigmoid(randn), as flash-linear-attention's tests do. Generated on
    ``device`` from ``seed``, so the same seed gives the same problem on every run.
    """
    if lengths is not None:
        B, T = 1, sum(lengths)
    N = len(lengths) if lengths is not None else B
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device)

    q = randn(B, T, H, K)
    q = F.normalize(q, dim=-1) if normalize_q else q
    k = F.normalize(randn(B, T, H, K), dim=-1)
    v = randn(B, T, H, V)
    if g_range is None:
        g = F.logsigmoid(randn(B, T, H, K))
    else:
        lo, hi = g_range
        g = lo + (hi - lo) * torch.rand(B, T, H, K, generator=gen, device=device)
    beta = randn(B, T, H).sigmoid()
    s0 = randn(N, H, K, V) * 0.5 if with_state else None
    bf16 = torch.bfloat16
    x = dict(q=q.to(bf16), k=k.to(bf16), v=v.to(bf16), g=g.to(g_dtype), beta=beta.to(beta_dtype))
    cu = None if lengths is None else cu_seqlens_of(lengths, device, cu_dtype)
    return x, s0, cu


def cu_seqlens_of(lengths: Sequence[int], device="cpu", dtype=torch.int32) -> torch.Tensor:
    """[0, l0, l0+l1, ...] for the packed varlen layout."""
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + int(n))
    return torch.tensor(bounds, dtype=dtype, device=device)
