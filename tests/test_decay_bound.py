"""The bound route small_bh's warm starts rest on (csrc/kda_chunk.cuh, kDropLog2), in fp64 on the CPU:
a chunk's state map T = Diag(eG) - Kr^T W (kdactl.reference.chunk_state_map) is the product of its
tokens' delta-rule maps, and ||T||_2 <= max eG + sum_t ||Kr_t|| ||W_t||.
A bound per key channel does not hold: carried_history_inputs keeps a quarter of the state through
chunks in which every channel decays by e^-40."""

from __future__ import annotations

import math

import pytest
import torch

from kdactl.reference import chunk_state_map
from tests.kda_inputs import carried_history_inputs, make_inputs

C = 16


def token_product(k, g, beta):
    """The same map token by token: S_t = (I - beta_t k_t k_t^T) Diag(e^g_t) S_{t-1}."""
    K = k.shape[-1]
    M = torch.eye(K, dtype=torch.float64)
    for t in range(C):
        kt = k[t].double()
        M = (torch.eye(K, dtype=torch.float64) - beta[t].double() * torch.outer(kt, kt)) @ torch.diag(g[t].double().exp()) @ M
    return M


def chunks_of(x, h=0, n=4):
    for c in range(n):
        rows = slice(c * C, (c + 1) * C)
        yield x["k"][0, rows, h].float(), x["g"][0, rows, h].float(), x["beta"][0, rows, h].float()


@pytest.mark.parametrize("g_range", [(-8.0, 0.0), (-1.0, 0.0), (-0.01, 0.0), None], ids=str)
def test_bound_holds_and_the_chunk_form_is_the_token_product(g_range):
    x, _ = make_inputs(1, 4 * C, 2, g_range=g_range, seed=3)
    maps = []
    for k, g, beta in chunks_of(x):
        T, bound = chunk_state_map(k, g, beta)
        assert torch.allclose(T, token_product(k, g, beta), atol=1e-12)
        assert torch.linalg.matrix_norm(T, 2) <= bound * (1 + 1e-12)
        maps.append((T, bound))
    product = maps[1][0] @ maps[0][0]  # and a product of maps is bounded by the product of bounds
    assert torch.linalg.matrix_norm(product, 2) <= maps[0][1] * maps[1][1] * (1 + 1e-12)


def test_strong_decay_is_forgotten_within_a_chunk_or_two():
    """Where the gate decays every channel strongly (g in [-8, 0]), the bound reaches 2^-20 (the
    kernels' kDropLog2) within two chunks: the warm starts are taken."""
    x, _ = make_inputs(1, 4 * C, 1, g_range=(-8.0, 0.0), seed=5)
    log2 = [math.log2(chunk_state_map(k, g, beta)[1]) for k, g, beta in chunks_of(x)]
    assert all(a + b <= -20 for a, b in zip(log2, log2[1:])), log2


def test_history_that_every_channel_forgets_but_the_state_keeps():
    x = carried_history_inputs(4 * C, H=1)
    for k, g, beta in chunks_of(x):
        per_channel = g.double().sum(0).exp().max()  # max_d prod_t e^g_d
        T, bound = chunk_state_map(k, g, beta)
        norm = torch.linalg.matrix_norm(T, 2)
        assert per_channel <= math.exp(-40) and norm >= 0.24, (per_channel, norm)
        assert bound >= norm  # so no warm start is taken on it: the segment starts stitched, exactly
