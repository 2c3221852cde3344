"""Test-side shorthands over kdactl.kda.inputs (one generator for smokes, bench and tests)."""

from __future__ import annotations

import torch

from kdactl.kda.inputs import cu_seqlens_of, random_inputs

__all__ = ["carried_history_inputs", "cu_seqlens_of", "make_inputs"]


def make_inputs(B, T, H, K=128, V=128, *, device="cpu", g_dtype=torch.float32, beta_dtype=torch.float32,
                state_n=None, g_range=(-1.0, 0.0), seed=0):  # fmt: skip
    """(inputs, initial state for ``state_n`` sequences or None) of a fixed [B, T] layout."""
    x, _, _ = random_inputs(B, T, H, K, V, device=device, seed=seed, g_range=g_range, g_dtype=g_dtype,
                            beta_dtype=beta_dtype)  # fmt: skip
    if state_n is None:
        return x, None
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    return x, torch.randn(state_n, H, K, V, generator=gen, device=device) * 0.5


def carried_history_inputs(T, H=1, K=128, V=128, *, device="cpu", seed=0):
    """Inputs (fixed layout, B = 1, log-space g) whose every key channel decays by e^-40 within each
    chunk of 16 tokens, while a quarter of the state survives the chunk: channels below K/2 decay
    (g = -5) on a chunk's first 8 tokens, the others on its last 8, and the keys of tokens 7 and 15
    (beta 1) move half of one channel's row into the other's before it decays. A bound per channel
    (max_d prod_t e^g_d) calls the history forgotten after one chunk; the chunk's state map keeps a
    norm of at least 1/4. q reads the two carrying channels, so o shows what was kept."""
    x, _, _ = random_inputs(1, T, H, K, V, device=device, seed=seed)
    pos = torch.arange(T, device=device) % 16
    low = torch.arange(K, device=device) < K // 2
    decays = (pos < 8)[:, None] == low[None, :]  # [T, K]
    x["g"] = torch.where(decays, -5.0, 0.0)[None, :, None, :].expand(1, T, H, K).contiguous()
    move = (pos == 7) | (pos == 15)
    carry = torch.zeros(K, device=device)
    carry[0], carry[K // 2] = 2**-0.5, -(2**-0.5)
    x["k"][0, move] = carry.to(x["k"].dtype)
    x["beta"][0, move] = 1.0
    reader = torch.zeros(T, K, device=device)
    reader[pos < 8, K // 2] = 1.0  # the carrying channel that does not decay there
    reader[pos >= 8, 0] = 1.0
    x["q"] = reader[None, :, None, :].expand(1, T, H, K).to(x["q"].dtype).contiguous()
    return x
