"""Where the chunk route's error comes from, on the CPU: the chunked form with the kernel's rounding
points (tf32 operands in the prepare pass; bf16 -W, Qg, Kr and hi + lo bf16 M', P in the workspace;
bf16 S and U as mma operands; bf16 o), each of which can be raised to tf32 or fp32, held to the fp64
reference. A and P as the prepare forms them, on tf32 operands: factored through the chunk's middle row
where its decay fits kShiftLimit, else each pair through the token where the chunk's halving parts it
(its steep path, steep_a_p).
An emulation, not a measurement of the kernel: keep its rounding points in step with csrc/kda_chunk.cuh.

    python3 tools/chunk_precision.py --T 4096 --H 2 --g 0
    python3 tools/chunk_precision.py --fla-gate-case   # fla's test_fused_recurrent_gate_in_kernel draw:
        # fp16 q/k/v (q, k L2-normalized), softplus gate from A_log = log U(1,16), h0 ~ N(0,1), scale 1
"""
import argparse

import torch

from kdactl.kda.inputs import random_inputs
from kdactl.reference import error_ratio, kda_recurrent

SHIFT_LIMIT = 60.0  # csrc/kda_chunk.cuh kShiftLimit


def bf16(x):
    return x.to(torch.bfloat16).float()


def tf32(x):  # round half away, as csrc/device.cuh's to_tf32 and the mma's truncation do
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def exact(x):
    return x


def hi_lo(x):  # the workspace's bf16 pair, as the recurrence's products see it
    hi = bf16(x)
    return hi + bf16(x - hi)


def pair_refs(n):
    """The token each pair (t, s <= t) of an n-token chunk is factored through on the steep path
    (csrc/kda_chunk.cuh steep_a_p): t itself on the diagonal, else the last token of s's half where
    the chunk's binary halving first parts them (the highest bit in which t and s differ)."""
    R = torch.arange(n).unsqueeze(1).expand(n, n).clone()  # [t, s]; s > t: unused
    for t in range(n):
        for s in range(t):
            b = (t ^ s).bit_length() - 1
            R[t, s] = (t & ~((2 << b) - 1)) + (1 << b) - 1
    return R


def a_and_p(qc, kc, G, scale, ops=tf32):
    """A (strictly lower) and P (lower) of each (head) chunk, as the prepare pass forms them (``ops``: the
    rounding of the products' operands, tf32 as built)."""
    n = qc.shape[-2]
    ref = G[..., n // 2 - 1 if n >= 8 else n - 1, :].unsqueeze(-2)  # the middle row (kRefRow) of a full chunk
    lower, strict = torch.ones(n, n).tril(), torch.ones(n, n).tril(-1)
    Gs = G - ref  # factored: (K e^G') (K e^-G')^T on tf32 operands
    A = ops(kc * Gs.exp()) @ ops(kc * (-Gs).exp()).transpose(-1, -2) * strict
    P = ops(qc * scale * Gs.exp()) @ ops(kc * (-Gs).exp()).transpose(-1, -2) * lower
    steep = (Gs.abs().amax(dim=(-2, -1)) > SHIFT_LIMIT) | (ref.amin(dim=(-2, -1)) < -SHIFT_LIMIT)
    if steep.any():  # e^(G_t - G_s) = e^(G_t - G_R) e^(G_R - G_s), each factor <= 1, on tf32 operands
        GR = G[..., pair_refs(n), :]  # [..., t, s, K]
        row = (G.unsqueeze(-2) - GR).clamp(max=0).exp()  # e^(G_t - G_R)
        Y = ops(kc.unsqueeze(-3) * (GR - G.unsqueeze(-3)).clamp(max=0).exp())  # k_s e^(G_R - G_s)
        A_steep = (ops(kc.unsqueeze(-2) * row) * Y).sum(-1) * strict
        P_steep = (ops(qc.unsqueeze(-2) * scale * row) * Y).sum(-1) * lower
        mask = steep[..., None, None]
        A, P = torch.where(mask, A_steep, A), torch.where(mask, P_steep, P)
    return A, P


def emulate(q, k, v, g, beta, s0, *, C=16, factors=bf16, mats=hi_lo, state=bf16, u=bf16, kr=bf16, scale=None,
            out=None, ap_ops=tf32, w_ops=tf32):
    B, T, H, K = q.shape
    V, scale = v.shape[-1], K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    o, S = torch.zeros(B, T, H, V), s0.clone().float()
    for c0 in range(0, T, C):
        qc, kc, vc, gc, bc = (x[:, c0:c0 + C].transpose(1, 2) for x in (q, k, v, g, beta))
        n = qc.shape[2]
        G = gc.cumsum(2)
        Kd, Qd = kc * G.exp(), qc * scale * G.exp()
        A, P = a_and_p(qc, kc, G, scale, ap_ops)
        M = torch.linalg.inv(torch.eye(n) + bc.unsqueeze(-1) * A) * bc.unsqueeze(-2)
        W, Qg = factors(w_ops(M) @ w_ops(Kd)), factors(Qd)
        Kr, eG = kr(kc * (G[:, :, -1:] - G).exp()), G[:, :, -1].exp()
        Sx = state(S)
        U = mats(M) @ vc - W @ Sx
        o[:, c0:c0 + C] = (out or bf16)(Qg @ Sx + mats(P) @ u(U)).transpose(1, 2)  # o in q's type
        S = S * eG.unsqueeze(-1) + Kr.transpose(-1, -2) @ u(U)
    return o, S


def fp16(x):
    return x.half().float()


VARIANTS = {
    "as built": {},
    # what bf16 m16n8k16 products in the prepare (half the mma and conversion instructions of tf32
    # m16n8k8) would cost in precision
    "A/P bf16 operands": dict(ap_ops=bf16),
    "A/P, W bf16 operands": dict(ap_ops=bf16, w_ops=bf16),
    "M', P bf16 alone": dict(mats=bf16),
    "M', P fp32": dict(mats=exact),
    "S tf32": dict(state=tf32),
    "U tf32": dict(u=tf32),
    "-W/Qg fp32": dict(factors=exact),
    "Kr fp32": dict(kr=exact),
    "S, U, Kr tf32": dict(state=tf32, u=tf32, kr=tf32),
    "S, U, Kr, -W/Qg tf32": dict(state=tf32, u=tf32, kr=tf32, factors=tf32),
    "U, Kr fp16": dict(u=fp16, kr=fp16),
    "U, Kr hi + lo bf16": dict(u=hi_lo, kr=hi_lo),
}


def fla_gate_case(T=1000, H=4, K=128, seed=42):
    """fla's test_fused_recurrent_gate_in_kernel[B3-T1000-H2-HV8-D128-...-float16] draw, one sequence of
    H value heads: (inputs, initial state, scale)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.rand(1, T, H, K, generator=gen).half().float() for _ in range(3))
    beta = torch.rand(1, T, H, generator=gen).half().float().sigmoid()
    A = torch.empty(H).uniform_(1, 16, generator=gen)
    g = -A[None, None, :, None] * torch.nn.functional.softplus(torch.randn(1, T, H, K, generator=gen))
    q, k = (torch.nn.functional.normalize(x, dim=-1) for x in (q, k))  # use_qk_l2norm_in_kernel
    return dict(q=q, k=k, v=v, g=g, beta=beta), torch.randn(1, H, K, K, generator=gen), 1.0

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--g", type=float, default=0.0, help="gates drawn from [-1e-3, 0] when 0, else [-g, 0]")
    ap.add_argument("--fla-gate-case", action="store_true", help="fla's fp16 softplus-gate test draw instead")
    args = ap.parse_args()
    if args.fla_gate_case:
        (x, s0, scale), out = fla_gate_case(), fp16
    else:
        g_range = (-1e-3, 0.0) if args.g == 0 else (-args.g, 0.0)
        x, s0, _ = random_inputs(1, args.T, args.H, seed=3, g_range=g_range, with_state=True)
        scale, out = None, bf16
    o_ref, s_ref = kda_recurrent(**x, initial_state=s0, scale=scale)
    for name, kw in VARIANTS.items():
        o, S = emulate(**x, s0=s0, scale=scale, out=out, **kw)
        print(f"{name:22s} o {error_ratio(o_ref, o):.2e}  state {error_ratio(s_ref, S):.2e}", flush=True)
