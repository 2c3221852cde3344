"""Test-side shorthands over kdactl.kda.inputs (one generator for smokes, bench and tests)."""

from __future__ import annotations

import torch

from kdactl.kda.inputs import cu_seqlens_of, random_inputs

__all__ = [
    "EDGE_CASES",
    "bend_to_edge",
    "carried_history_inputs",
    "cu_seqlens_of",
    "fla_gate_case",
    "gate_error",
    "gate_sweep",
    "make_inputs",
    "raw_inputs",
]


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


EDGE_CASES = ("identical-keys", "all-at-bound", "half-at-bound", "steep-softplus")


def bend_to_edge(case: str, x: dict, A_log: torch.Tensor, dt_bias: torch.Tensor) -> str:
    """Bends fla's raw draw (x's g in fp32, A_log, dt_bias) in place into one of the cases that broke
    other kernels, and names the configuration it runs in ("softplus" or "bound"):
    identical-keys: every key the first one, no decay (softplus of -90 = 0), beta = sigmoid(12) ~ 1 - 6e-6;
    all-at-bound: every gate at the lower bound (lb sigmoid(A x) = lb at x = 50);
    half-at-bound: half the channels at the bound, half undecayed (the chunk's shifted reference at |G'| = 40);
    steep-softplus: A = 4 and softplus(5) = 5, -20 a token (a chunk's decay past kShiftLimit)."""
    K = x["q"].shape[-1]
    dt_bias.zero_()
    if case == "identical-keys":
        x["k"][:, :, :] = x["k"][:, :1, :]
        x["g"].fill_(-90.0)
        x["beta"].fill_(12.0)
    elif case == "all-at-bound":
        x["g"].fill_(50.0)
    elif case == "half-at-bound":
        x["g"][..., : K // 2] = 50.0
        x["g"][..., K // 2 :] = -200.0  # sigmoid(-200 A) = 0: no decay
    elif case == "steep-softplus":
        A_log.fill_(4.0).log_()
        x["g"].fill_(5.0)
    else:
        raise ValueError(f"no edge case {case!r}")
    return "softplus" if case in ("identical-keys", "steep-softplus") else "bound"


def raw_inputs(T, H, draw, *, K=128, lengths=None, fp16=False, seed=0):
    """Raw projections as an engine passes them with fused transforms (B = 1; ``lengths``: a varlen
    batch), on the CPU, gate parameters drawn as kdactl.bench's ``draw`` (test, init, flashkda)."""
    from kdactl.bench.candidates import gate_params

    B = 1
    if lengths is not None:
        T = sum(lengths)
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float16 if fp16 else torch.bfloat16

    def randn(*size):
        return torch.randn(*size, generator=gen)

    x = dict(q=randn(B, T, H, K).to(dtype), k=randn(B, T, H, K).to(dtype), v=randn(B, T, H, K).to(dtype),
             g=randn(B, T, H, K).to(torch.bfloat16), beta=randn(B, T, H).to(torch.bfloat16))  # fmt: skip
    A_log, dt_bias = gate_params(draw, H, K, gen, "cpu")
    return x, A_log, dt_bias


# Raw gate inputs x = g + dt_bias swept over every region of both gates: softplus's cubic for
# e^-|x| and its linear part past 20, the sigmoid's saturation at either end, and x = 0.
GATE_SWEEP = torch.cat([torch.linspace(-30, 30, 97), torch.tensor([-20.1, -19.9, -15.0, -8.0, -4.16, -4.15, -1e-3,
                                                                   0.0, 1e-3, 4.15, 4.16, 8.0, 15.0, 19.9, 20.0,
                                                                   20.1, 25.0, -87.0, 87.0, -0.5, 0.5, -2.0, 2.0,
                                                                   -6.0, 6.0, -10.0, 10.0, -12.0, 12.0, -3.0, 3.0])])


def gate_sweep(T: int, gate: str, *, device: str = "cpu"):
    """(prefill's keyword arguments, G_T in fp64 [H, K]) of a call whose final state measures the
    in-kernel gate: beta = 0, so nothing enters the state and S_T = e^(G_T) S_0 per key, G_T the sum of
    T equal gates of x = dt_bias = GATE_SWEEP (g = 0), 2 heads. Head 1's A = e^5 turns softplus's tiny
    values (x = -15: 3e-7 a token) into a decay that thousands of tokens sum to a measurable one, where
    an absolute error of the gate (log(1 + z) near z = 0) would pile up. gate: "softplus" or "bound"."""
    from kdactl.kda.fused import GATE_LOWER_BOUND, GATE_SOFTPLUS, Fused
    from kdactl.reference import fused_inputs

    K, H = 128, 2
    assert GATE_SWEEP.numel() == K
    fused = Fused(gate_mode=GATE_SOFTPLUS) if gate == "softplus" else Fused(gate_mode=GATE_LOWER_BOUND, lower_bound=-5.0)
    gen = torch.Generator(device=device).manual_seed(T)
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=device, generator=gen), dim=-1).bfloat16()
    x = {"q": q, "k": q.clone(), "v": torch.randn(1, T, H, K, device=device, generator=gen).bfloat16(),
         "g": torch.zeros(1, T, H, K, device=device), "beta": torch.zeros(1, T, H, device=device).bfloat16()}  # fmt: skip
    A_log = torch.tensor([0.0, 5.0], device=device)
    dt_bias = GATE_SWEEP.to(device).repeat(H)
    s0 = torch.ones(1, H, K, K, device=device)
    _, _, g64, _ = fused_inputs(x["q"][:, :1], x["k"][:, :1], x["v"][:, :1], x["g"][:, :1], x["beta"][:, :1], fused,
                                A_log, dt_bias)  # fmt: skip
    kwargs = dict(x, fused=fused, A_log=A_log, dt_bias=dt_bias, initial_state=s0)
    return kwargs, T * g64[0, 0]


def gate_error(final_state, G_true, route: str, T: int, *, per_step: float, per_nat: float):
    """(worst, largest) of a gate_sweep call: the log of its final state against G_T, |dG| over the
    budget steps per_step + |G_T| per_nat (a step is a token of route direct, a chunk of 16 otherwise),
    worst among keys whose e^G_T is above fp32's underflow, and the largest |dG| there."""
    G_meas = final_state[0, :, :, 0].double().log()
    visible = G_true > -80  # e^G_T above fp32's underflow
    steps = T if route == "direct" else -(-T // 16)
    err = (G_meas - G_true).abs()
    return (err / (steps * per_step + G_true.abs() * per_nat))[visible].max().item(), err[visible].max().item()


def fla_gate_case():
    """(inputs, h0, fused, A_log, dt_bias, scale) of fla's test_fused_recurrent_gate_in_kernel
    [B3-T1000-H2-HV8-D128-float16] draw, on the CPU: fp16 q, k, v (2 q/k heads for 8 value heads),
    l2norm, the softplus gate from A_log = log U(1, 16) without dt_bias, scale 1, h0 ~ N(0, 1)."""
    from kdactl.kda.fused import GATE_SOFTPLUS, Fused

    gen = torch.Generator().manual_seed(42)
    B, T, H, HV, D = 3, 1000, 2, 8, 128
    q, k = (torch.rand(B, T, H, D, generator=gen).half() for _ in range(2))
    v = torch.rand(B, T, HV, D, generator=gen).half()
    beta = torch.rand(B, T, HV, generator=gen).half().sigmoid()
    g = torch.randn(B, T, HV, D, generator=gen)
    A_log = torch.empty(HV).uniform_(1, 16, generator=gen).log()
    h0 = torch.randn(B, HV, D, D, generator=gen)
    fused = Fused(qk_l2norm=True, gate_mode=GATE_SOFTPLUS)
    return dict(q=q, k=k, v=v, g=g, beta=beta), h0, fused, A_log, None, 1.0
