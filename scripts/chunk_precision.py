"""Where the chunk route's error comes from, on the CPU: the chunked form with the kernel's rounding
points (tf32 operands in the prepare pass; bf16 -W, Qg, Kr and hi + lo bf16 M', P in the workspace;
bf16 S and U as mma operands; bf16 o), each of which can be raised to tf32 or fp32, held to the fp64
reference.
An emulation, not a measurement of the kernel: keep its rounding points in step with csrc/kda_chunk.cuh.

    python3 scripts/chunk_precision.py --T 4096 --H 2 --g 0
"""
import argparse

import torch

from kdactl.kda.inputs import random_inputs
from kdactl.reference import error_ratio, kda_recurrent


def bf16(x):
    return x.to(torch.bfloat16).float()


def tf32(x):  # round half away, as csrc/device.cuh's to_tf32 and the mma's truncation do
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def exact(x):
    return x


def hi_lo(x):  # the workspace's bf16 pair, as the recurrence's products see it
    hi = bf16(x)
    return hi + bf16(x - hi)


def emulate(q, k, v, g, beta, s0, *, C=16, factors=bf16, mats=hi_lo, state=bf16, u=bf16, kr=bf16):
    B, T, H, K = q.shape
    V, scale = v.shape[-1], K**-0.5
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    o, S = torch.zeros(B, T, H, V), s0.clone().float()
    for c0 in range(0, T, C):
        qc, kc, vc, gc, bc = (x[:, c0:c0 + C].transpose(1, 2) for x in (q, k, v, g, beta))
        n = qc.shape[2]
        G = gc.cumsum(2)
        Kd, Ki, Qd = kc * G.exp(), kc * (-G).exp(), qc * scale * G.exp()
        A = tf32(Kd) @ tf32(Ki).transpose(-1, -2) * torch.ones(n, n).tril(-1)
        P = tf32(Qd) @ tf32(Ki).transpose(-1, -2) * torch.ones(n, n).tril()
        M = torch.linalg.inv(torch.eye(n) + bc.unsqueeze(-1) * A) * bc.unsqueeze(-2)
        W, Qg = factors(tf32(M) @ tf32(Kd)), factors(Qd)
        Kr, eG = kr(kc * (G[:, :, -1:] - G).exp()), G[:, :, -1].exp()
        Sx = state(S)
        U = mats(M) @ vc - W @ Sx
        o[:, c0:c0 + C] = bf16(Qg @ Sx + mats(P) @ u(U)).transpose(1, 2)
        S = S * eG.unsqueeze(-1) + Kr.transpose(-1, -2) @ u(U)
    return o, S


VARIANTS = {
    "as built": {},
    "M', P bf16 alone": dict(mats=bf16),
    "M', P fp32": dict(mats=exact),
    "S tf32": dict(state=tf32),
    "U tf32": dict(u=tf32),
    "-W/Qg fp32": dict(factors=exact),
    "Kr fp32": dict(kr=exact),
    "S, U, Kr tf32": dict(state=tf32, u=tf32, kr=tf32),
    "S, U, Kr, -W/Qg tf32": dict(state=tf32, u=tf32, kr=tf32, factors=tf32),
}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--g", type=float, default=0.0, help="gates drawn from [-1e-3, 0] when 0, else [-g, 0]")
    args = ap.parse_args()
    g_range = (-1e-3, 0.0) if args.g == 0 else (-args.g, 0.0)
    x, s0, _ = random_inputs(1, args.T, args.H, seed=3, g_range=g_range, with_state=True)
    o_ref, s_ref = kda_recurrent(**x, initial_state=s0)
    for name, kw in VARIANTS.items():
        o, S = emulate(**x, s0=s0, **kw)
        print(f"{name:22s} o {error_ratio(o_ref, o):.2e}  state {error_ratio(s_ref, S):.2e}", flush=True)
