"""Reference implementations of KDA prefill, the yardsticks every kernel route is held to.

``kda_recurrent`` is the SPEC's fp64 token-by-token recurrence on the CPU:

    S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T (scale * q_t)

``kda_chunked`` is the same function in chunked (WY / UT) form in fp32: within a chunk the
recurrence becomes small matrix products, between chunks one state pass. It is the algorithm the
chunked kernel route implements, and tests hold it against ``kda_recurrent``.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


ERROR_LIMIT = 5e-3  # SPEC: the most error_ratio any route may show, for o and for the final state


def error_ratio(ref: Tensor, x: Tensor | None) -> float:
    """The SPEC's correctness measure: rms(ref - x) / rms(ref), in fp64 on ref's device (a GPU
    output is not copied to the CPU). NaN anywhere, a missing x or another shape -> inf."""
    if x is None or tuple(x.shape) != tuple(ref.shape):
        return float("inf")
    ref64, x64 = ref.detach().double(), x.detach().to(ref.device).double()
    if not torch.isfinite(x64).all():
        return float("inf")
    denom = ref64.pow(2).mean().sqrt().item()
    num = (ref64 - x64).pow(2).mean().sqrt().item()
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom


def _sequences(q: Tensor, cu_seqlens: Tensor | None) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence, in state order."""
    B, T = q.shape[:2]
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]


def kda_recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, device="cpu",
                  checkpoint_every=None):  # fmt: skip
    """fp64 token-by-token reference. Returns (o [B,T,H,V] fp64, final_state [N,H,K,V] fp64), and
    with ``checkpoint_every`` C a third item: every sequence's state before tokens 0, C, 2C, ...
    (as kdactl.kda.prefill's checkpoints), sequence after sequence, [rows, H, K, V] fp64.

    Runs on the CPU by default; ``device="cuda"`` runs the same fp64 arithmetic on the GPU, which
    only shortens long test references.
    """
    q, k, v, g, beta = (x.detach().to(device, torch.float64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else float(scale)
    seqs = _sequences(q, cu_seqlens)
    o = torch.zeros(B, T, H, V, dtype=torch.float64, device=device)
    final = torch.zeros(len(seqs), H, K, V, dtype=torch.float64, device=device)
    checkpoints = []
    for n, (b, bos, eos) in enumerate(seqs):
        S = torch.zeros(H, K, V, dtype=torch.float64, device=device)
        if initial_state is not None:
            S = initial_state[n].detach().to(device, torch.float64).clone()
        for t in range(bos, eos):
            if checkpoint_every and (t - bos) % checkpoint_every == 0:
                checkpoints.append(S)
            kt, vt, bt = k[b, t], v[b, t], beta[b, t]  # [H,K], [H,V], [H]
            S = S * g[b, t].exp().unsqueeze(-1)  # Diag(exp g_t) S
            u = bt.unsqueeze(-1) * (vt - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)  # (I - b k k^T) S' + b k v^T
            o[b, t] = torch.einsum("hk,hkv->hv", q[b, t] * scale, S)
        final[n] = S
    if checkpoint_every:
        rows = torch.stack(checkpoints) if checkpoints else torch.zeros(0, H, K, V, dtype=torch.float64, device=device)
        return o, final, rows
    return o, final


def kda_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, chunk_size=16):
    """fp32 chunked (WY/UT) form of the same recurrence, on the inputs' device.

    Within a chunk with in-chunk cumulative log-decay G_t and start state S_0:
      U = (I + Diag(beta) A)^-1 Diag(beta) (V - (K * exp G) S_0),  A_ts = sum_i k_ti k_si exp(G_ti - G_si), s < t
      O = (Q * exp G) S_0 + (P o M) U,                              P_ts = sum_i q_ti k_si exp(G_ti - G_si), s <= t
      S_C = exp(G_C) * S_0 + (K * exp(G_C - G))^T U
    Every exponent is a difference G_t - G_s with s <= t, so no term grows for decaying gates.
    """
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else float(scale)
    seqs = _sequences(q, cu_seqlens)
    o = torch.zeros(B, T, H, V, dtype=torch.float32, device=q.device)
    final = torch.zeros(len(seqs), H, K, V, dtype=torch.float32, device=q.device)
    for n, (b, bos, eos) in enumerate(seqs):
        S = torch.zeros(H, K, V, device=q.device)
        if initial_state is not None:
            S = initial_state[n].float().clone()
        for c0 in range(bos, eos, chunk_size):
            c1 = min(c0 + chunk_size, eos)
            sl = (b, slice(c0, c1))
            out, S = _chunk(q[sl] * scale, k[sl], v[sl], g[sl], beta[sl], S)
            o[sl] = out
        final[n] = S
    return o, final


def _chunk(q, k, v, g, beta, S):
    """One chunk of kda_chunked; inputs [C,H,*], q already scaled. Returns (O [C,H,V], end state)."""
    C = q.shape[0]
    G = g.cumsum(0)  # [C,H,K]
    diff = G.unsqueeze(1) - G.unsqueeze(0)  # [t,s,H,K] = G_t - G_s
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(causal[:, :, None, None], diff, torch.full_like(diff, -float("inf"))).exp()
    A = torch.einsum("thk,shk,tshk->hts", k, k, decay).tril(-1)  # strictly lower
    P = torch.einsum("thk,shk,tshk->hts", q, k, decay)  # lower incl. diagonal
    bT = beta.transpose(0, 1)  # [H,C]
    eye = torch.eye(C, device=q.device)
    rhs = bT.unsqueeze(-1) * (v.transpose(0, 1) - torch.einsum("thk,hkv->htv", k * G.exp(), S))
    U = torch.linalg.solve_triangular(eye + bT.unsqueeze(-1) * A, rhs, upper=False, unitriangular=True)
    O = torch.einsum("thk,hkv->htv", q * G.exp(), S) + P @ U  # [H,C,V]  # noqa: E741 (the math's name)
    GC = G[-1]  # [H,K]
    S_end = GC.exp().unsqueeze(-1) * S + torch.einsum("thk,htv->hkv", k * (GC - G).exp(), U)
    return O.transpose(0, 1), S_end


def fused_inputs(q, k, v, g, beta, fused, A_log=None, dt_bias=None):
    """(q, k, g, beta) in fp64 as the recurrence sees them when the kernels fuse fla's input
    transforms (kdactl.kda.fused: q/k l2norm, the gate from raw g, beta's sigmoid), with grouped
    values' shared q/k heads repeated to v's heads: the reference inputs for such a call."""
    from kdactl.kda.fused import BETA_AS_GIVEN, BETA_SIGMOID2, GATE_SOFTPLUS, L2NORM_EPS, SOFTPLUS_LINEAR_ABOVE

    H, K = v.shape[2], q.shape[-1]
    q, k, g, beta = (x.detach().double() for x in (q, k, g, beta))
    if fused.qk_l2norm:
        q, k = (x / (x.pow(2).sum(-1, keepdim=True) + L2NORM_EPS).sqrt() for x in (q, k))
    group = H // q.shape[2]
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    if fused.gated:
        x = g + (dt_bias.detach().double().reshape(H, K).to(g.device) if dt_bias is not None else 0.0)
        a = A_log.detach().double().to(g.device).exp()[:, None] if A_log is not None else 1.0  # the kernels' e^A_log
        if fused.gate_mode == GATE_SOFTPLUS:
            g = -a * torch.where(x > SOFTPLUS_LINEAR_ABOVE, x, torch.log1p(torch.exp(x)))
        else:
            g = fused.lower_bound * torch.sigmoid(a * x)
    if fused.beta_mode != BETA_AS_GIVEN:
        beta = torch.sigmoid(beta) * (2.0 if fused.beta_mode == BETA_SIGMOID2 else 1.0)
    return q, k, g, beta


def chunk_state_map(k: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk's state map in fp64, (T, bound): S_end = T S_start + (terms of the chunk's own
    tokens) with T = Diag(eG) - Kr^T W, from the chunk factors the kernels form (csrc/kda_chunk.cuh),
    and the bound on ||T||_2 that route small_bh's warm starts rest on, max eG + sum_t ||Kr_t|| ||W_t||
    (before the kernels' allowance for bf16 rounding). k, g [C, K] (g the log decay), beta [C]."""
    k, g, beta = k.double(), g.double(), beta.double()
    C = k.shape[0]
    G = g.cumsum(0)
    decay = torch.exp(G[:, None, :] - G[None, :, :])  # [t, s, key]: e^(G_t - G_s)
    A = torch.tril(beta[:, None] * torch.einsum("tk,sk,tsk->ts", k, k, decay), diagonal=-1)
    eye = torch.eye(C, dtype=torch.float64, device=k.device)
    W = torch.linalg.solve(eye + A, torch.diag(beta)) @ (k * torch.exp(G))
    Kr, eG = k * torch.exp(G[-1] - G), torch.exp(G[-1])
    T = torch.diag(eG) - Kr.T @ W
    return T, eG.max() + (Kr.norm(dim=1) * W.norm(dim=1)).sum()
