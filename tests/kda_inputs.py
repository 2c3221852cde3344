"""Test-side shorthands over kdactl.kda.inputs (one generator for smokes, bench and tests)."""

from __future__ import annotations

import torch

from kdactl.kda.inputs import cu_seqlens_of, random_inputs

__all__ = ["cu_seqlens_of", "make_inputs"]


def make_inputs(B, T, H, K=128, V=128, *, device="cpu", g_dtype=torch.float32, beta_dtype=torch.float32,
                state_n=None, g_range=(-1.0, 0.0), seed=0):  # fmt: skip
    """(inputs, initial state for ``state_n`` sequences or None) of a fixed [B, T] layout."""
    x, _, _ = random_inputs(B, T, H, K, V, device=device, seed=seed, g_range=g_range, g_dtype=g_dtype,
                            beta_dtype=beta_dtype)  # fmt: skip
    if state_n is None:
        return x, None
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    return x, torch.randn(state_n, H, K, V, generator=gen, device=device) * 0.5
