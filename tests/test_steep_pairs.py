"""The prepare's steep path (csrc/kda_chunk.cuh steep_a_p and SteepLevel), modelled on the CPU lane by
lane: its five tensor-core products (m16n8k8, tf32) cover every pair (t, s <= t) of a chunk exactly once,
each factored through a token R with s <= R <= t, so neither factor e^(G_t - G_R) nor e^(G_R - G_s) can
exceed 1 however steep the decay; and at decays where the fast path's one reference row overflows fp32,
the sums stay within tf32's rounding of fp64."""

import pytest
import torch

C = 16
LEVELS = 5


# SteepLevel, as the kernel spells it (levels 0-2: bit 3 - lv; 3: t = 2m + 1 with s = 2m, and P's
# even diagonal; 4: P's odd diagonal).
def row_ref(lv, r):
    if lv <= 2:
        b = 3 - lv
        return (r & ~((2 << b) - 1)) + (1 << b) - 1 if (r >> b) & 1 else -1
    return r & ~1 if lv == 3 else (r if r & 1 else -1)


def col_token(lv, n):
    if lv <= 2:
        b = 3 - lv
        return ((n >> b) << (b + 1)) | (n & ((1 << b) - 1))
    return 2 * n + (lv == 4)


def col_ref(lv, s):
    if lv <= 2:
        b = 3 - lv
        return (s & ~((2 << b) - 1)) + (1 << b) - 1
    return s


def written(lv):
    """The (row, token s, reference) of every output this level's product writes, lane by lane."""
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            r, s = g + 8 * (i >> 1), col_token(lv, 2 * t + (i & 1))
            ref = row_ref(lv, r)
            if ref >= 0 and ref == col_ref(lv, s):
                out.append((r, s, ref))
    return out


def test_every_pair_once_through_a_token_between():
    seen = {}
    for lv in range(LEVELS):
        for r, s, ref in written(lv):
            assert (r, s) not in seen, f"pair {(r, s)} written by levels {seen[(r, s)]} and {lv}"
            seen[(r, s)] = lv
            assert s <= ref <= r  # both factors <= 1 for a falling G
            if s < r:  # the highest bit in which r and s differ parts them at ref
                b = (r ^ s).bit_length() - 1
                assert ref >> b == s >> b and (ref + 1) >> b == r >> b
    assert set(seen) == {(r, s) for r in range(C) for s in range(r + 1)}
    assert all(lv == 4 for (r, s), lv in seen.items() if s == r and r & 1)  # level 4: P's odd diagonal only


LOG2E = 1.4426950408889634


def tf32(x):  # csrc/device.cuh to_tf32: round half away into the 19 bits the mma reads
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def steep_a_p(k, q, G, beta, scale):
    """A (times beta) and P as steep_a_p forms them: per level, the rows g and g + 8 and the B column g
    that the lanes of group g hold (over all keys: the kernel's k-steps only split the sum), the
    products in fp64 over tf32 operands (the mma's fp32 sums are far finer than the operands). G comes
    in log2 units (fp32), each factor is a power of 2; a row with no pair at a level is its own
    reference, level 4's rows and the columns of levels 3 and 4 go in as they are (q and k are bf16
    values, tf32 already), and P's scale multiplies each sum."""
    K = k.shape[1]
    G2 = G.float() * LOG2E
    NM, P = torch.zeros(C, C, dtype=torch.float64), torch.zeros(C, C, dtype=torch.float64)
    for lv in range(LEVELS):
        A_k, A_q, B = (torch.zeros(C, K), torch.zeros(C, K), torch.zeros(K, 8))
        for g in range(8):
            for half in range(2):
                r = g + 8 * half
                ref = row_ref(lv, r)
                e = torch.ones(K) if lv == 4 else torch.exp2(G2[r] - G2[ref if ref >= 0 else r])
                A_k[r], A_q[r] = k[r] * e, q[r] * e
            s = col_token(lv, g)
            B[:, g] = k[s] * torch.exp2(G2[col_ref(lv, s)] - G2[s]) if lv <= 2 else k[s]
        D_k, D_q = tf32(A_k).double() @ tf32(B).double(), tf32(A_q).double() @ tf32(B).double()
        for r, s, _ in written(lv):
            n = [n for n in range(8) if col_token(lv, n) == s][0]
            P[r, s] = scale * D_q[r, n]
            if s < r:
                NM[r, s] = beta[r] * D_k[r, n]
    return NM, P


@pytest.mark.parametrize("K", [64, 128])
def test_steep_decays_stay_finite_and_within_tf32(K):
    gen = torch.Generator().manual_seed(K)
    k, q = (torch.randn(C, K, generator=gen).bfloat16().float() for _ in range(2))  # the kernel's bf16 inputs
    g = -80 * torch.rand(C, K, generator=gen) * torch.rand(K, generator=gen)  # up to -80 a token, per channel
    g[:, 0] = -80.0  # one channel at -80 every token: 640 over the 8 tokens either side of the middle
    G, beta, scale = g.cumsum(0), torch.rand(C, generator=gen), K**-0.5
    mid = G - G[C // 2 - 1]  # the fast path's factors overflow here
    assert not torch.isfinite(torch.exp(mid)).all()
    NM, P = steep_a_p(k, q, G, beta, scale)
    D = torch.exp((G.double()[:, None] - G.double()[None]).clamp(max=0))  # [t, s, key]
    terms_a = k.double()[:, None] * k.double()[None] * D
    terms_p = q.double()[:, None] * k.double()[None] * D * scale
    lower, strict = torch.ones(C, C).tril().double(), torch.ones(C, C).tril(-1).double()
    A_ref, P_ref = terms_a.sum(-1) * beta.double()[:, None] * strict, terms_p.sum(-1) * lower
    # Each term has two tf32 roundings (2^-11 each, relative): the error is at most 2^-10 (and a little)
    # of the sum of the terms' sizes.
    bound_a = 1.01 * 2**-10 * terms_a.abs().sum(-1) * beta.double()[:, None] * strict
    bound_p = 1.01 * 2**-10 * terms_p.abs().sum(-1) * lower
    assert torch.isfinite(NM).all() and torch.isfinite(P).all()
    assert ((NM - A_ref).abs() <= bound_a + 1e-30).all()
    assert ((P - P_ref).abs() <= bound_p + 1e-30).all()
    # P's diagonal has factor 1 and q, k are tf32 values: exact but for the sums' own rounding; off it,
    # the factors are rounded to tf32 and the bound is what holds.
    assert torch.allclose(P.diagonal(), P_ref.diagonal(), rtol=1e-12, atol=0)
    assert ((P - P_ref) * strict).abs().max() > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_bf16_and_fp16_value_is_a_tf32_value(dtype):
    """steep_a_p (tf32_exact) hands q and k, widened from their 16-bit type, to the mma unrounded where
    their factor is 1: that is exact only if every such value, subnormals included, has nothing in the
    13 low mantissa bits that tf32 drops."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).float()
    x = x[torch.isfinite(x)]
    assert x.numel() >= 2**16 - 2 * 2**(8 if dtype == torch.bfloat16 else 10)
    assert torch.equal(tf32(x), x)
