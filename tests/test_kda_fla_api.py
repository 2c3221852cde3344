"""kdactl.kda.chunk_kda (fla 0.6.0's signature) on the CPU: how fla's flags map onto the fused
transforms prefill gets, every refusal naming what is not supported, the gate parameters' checks,
and the torch reference of the transforms (kdactl.reference.fused_inputs)."""

import math

import pytest
import torch

from kdactl.kda import chunk_kda, fla_api
from kdactl.kda.fused import BETA_SIGMOID, BETA_SIGMOID2, GATE_LOWER_BOUND, GATE_SOFTPLUS, NONE, Fused
from kdactl.kda.validation import validate, validate_fused
from kdactl.reference import fused_inputs
from tests.kda_inputs import make_inputs


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(fla_api, "prefill", lambda *a, **kw: seen.append(kw) or ("o", "state"))
    return seen


def x_of(T=8, H=2):
    x, _ = make_inputs(1, T, H)
    return x


def test_plain_call_passes_through_with_no_transform(calls):
    cu = torch.tensor([0, 3, 8])
    assert chunk_kda(**x_of(), scale=0.5, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=[0, 3, 8]) == ("o", "state")
    (kw,) = calls
    assert kw["fused"] == NONE and kw["scale"] == 0.5 and kw["cu_seqlens"] is cu and kw["cu_seqlens_cpu"] == [0, 3, 8]
    assert kw["A_log"] is None and kw["dt_bias"] is None and kw["output_final_state"] is True


@pytest.mark.parametrize("flags, fused", [
    ({"use_qk_l2norm_in_kernel": True}, Fused(qk_l2norm=True)),
    ({"use_beta_sigmoid_in_kernel": True}, Fused(beta_mode=BETA_SIGMOID)),
    ({"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True}, Fused(beta_mode=BETA_SIGMOID2)),
    ({"use_gate_in_kernel": True, "A_log": "A"}, Fused(gate_mode=GATE_SOFTPLUS)),
    ({"use_gate_in_kernel": True, "lower_bound": -5}, Fused(gate_mode=GATE_LOWER_BOUND, lower_bound=-5.0)),
    ({"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -2, "A_log": "A"},
     Fused(gate_mode=GATE_LOWER_BOUND, lower_bound=-2.0)),
    ({"A_log": "A", "dt_bias": "b", "lower_bound": -5}, NONE),  # fla reads them only with use_gate_in_kernel
    ({"safe_gate": True, "disable_recompute": True, "chunk_size": 32}, NONE),  # kernel choices there, none here
])  # fmt: skip
def test_fla_flags_become_the_kernels_transforms(calls, flags, fused):
    chunk_kda(**x_of(), **flags)
    assert calls[0]["fused"] == fused
    gated = fused.gated
    assert calls[0]["A_log"] == (flags.get("A_log") if gated else None)


def test_gate_parameters_reach_the_kernels_in_fp32(calls):
    A_log, dt_bias = torch.zeros(2, dtype=torch.bfloat16), torch.zeros(256, dtype=torch.float16)
    chunk_kda(**x_of(), use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    assert calls[0]["A_log"].dtype == torch.float32 and calls[0]["dt_bias"].dtype == torch.float32


@pytest.mark.parametrize("change, match", [
    ({"state_v_first": True, "transpose_state_layout": True}, "pass state_v_first or the deprecated"),
    ({"return_intermediate_states": True, "disable_recompute": True}, "return_intermediate_states must be used with"),
    ({"cp_context": object()}, "cp_context"),
    ({"chunk_size": 48}, "`chunk_size` must be either 32 or 64, got 48"),
    ({"head_first": True}, r"unsupported arguments \['head_first'\]"),
    ({"allow_neg_eigval": True}, "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    ({"use_gate_in_kernel": True}, "A_log must be provided"),
    ({"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -6}, r"safe_gate with use_gate_in_kernel needs lower_bound in \[-5, 0\), got -6"),
    ({"use_graph": True, "max_num_seqs": 4, "cu_seqlens": torch.tensor([0, 8])}, "max_num_seqs must equal"),
])  # fmt: skip
def test_what_fla_accepts_and_kdactl_does_not_is_a_value_error_naming_it(calls, change, match):
    x, change = x_of(), dict(change)
    with pytest.raises(ValueError, match=f"^kdactl.kda.chunk_kda: {match}"):
        chunk_kda(**x, **change)
    assert calls == []


@pytest.mark.parametrize("flags, v_first", [({"state_v_first": True}, True), ({"transpose_state_layout": True}, True), ({}, False)])
def test_state_layout_reaches_prefill(calls, flags, v_first):
    chunk_kda(**x_of(), **flags)
    assert calls[0]["state_v_first"] is v_first and calls[0]["checkpoint_every"] is None


@pytest.mark.parametrize("chunk_size", [None, 32])
def test_intermediate_states_are_bf16_checkpoints_every_chunk(calls, chunk_size):
    extra = {} if chunk_size is None else {"chunk_size": chunk_size}
    chunk_kda(**x_of(), return_intermediate_states=True, **extra)
    assert calls[0]["checkpoint_every"] == (chunk_size or 64) and calls[0]["checkpoint_dtype"] == torch.bfloat16


def test_fp16_passes_as_it_is_and_fp32_is_read_in_bf16_with_o_back_in_fp32(monkeypatch):
    seen = []

    def fake(q, k, v, *a, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return torch.zeros(v.shape, dtype=q.dtype), None

    monkeypatch.setattr(fla_api, "prefill", fake)
    x = x_of()
    half = {n: x[n].to(torch.float16) if n in "qkv" else x[n] for n in x}
    assert chunk_kda(**half)[0].dtype == torch.float16 and seen[-1] == (torch.float16,) * 3
    full = {n: x[n].float() if n in "qkv" else x[n] for n in x}
    assert chunk_kda(**full)[0].dtype == torch.float32 and seen[-1] == (torch.bfloat16,) * 3


def test_gradients_are_refused_not_silently_dropped(calls):
    x = x_of()
    x["q"] = x["q"].float().requires_grad_().bfloat16()
    with pytest.raises(ValueError, match="computes no gradients"):
        chunk_kda(**x)
    with torch.no_grad():
        chunk_kda(**x)
    assert len(calls) == 1


# --- the gate's parameters ---------------------------------------------------------------------


def _problem(H=2, Hq=2):
    x, _ = make_inputs(1, 8, H)
    if Hq != H:
        x["q"], x["k"] = x["q"][:, :, :Hq].contiguous(), x["k"][:, :, :Hq].contiguous()
    return validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, None, require_cuda=False)


@pytest.mark.parametrize("fused, A_log, dt_bias, match", [
    (NONE, torch.zeros(2), None, "A_log is given without a gate"),
    (NONE, None, torch.zeros(256), "dt_bias is given without a gate"),
    (Fused(gate_mode=GATE_SOFTPLUS), None, None, "A_log is required"),
    (Fused(gate_mode=GATE_SOFTPLUS), torch.zeros(3), None, r"A_log must have shape \(2,\)"),
    (Fused(gate_mode=GATE_SOFTPLUS), torch.zeros(2, dtype=torch.float64), None, "A_log must be float32"),
    (Fused(gate_mode=GATE_LOWER_BOUND, lower_bound=-5), None, torch.zeros(2, 64), r"dt_bias must have shape \(256,\) or \(2, 128\)"),
])  # fmt: skip
def test_gate_parameters_are_checked(fused, A_log, dt_bias, match):
    with pytest.raises(ValueError, match=match):
        validate_fused(fused, A_log, dt_bias, _problem(), torch.device("cpu"), require_cuda=False)


def test_good_gate_parameters_and_grouped_values_pass():
    p = _problem(H=4, Hq=2)
    assert p.heads == 4 and p.qk_heads == 2
    validate_fused(Fused(gate_mode=GATE_SOFTPLUS), torch.zeros(4), torch.zeros(4, 128), p, torch.device("cpu"),
                   require_cuda=False)  # fmt: skip
    assert _problem().qk_heads == 0  # the same heads: no grouping


@pytest.mark.parametrize("bad", [dict(beta_mode=3), dict(gate_mode=-1), dict(gate_mode=GATE_LOWER_BOUND, lower_bound=0.0)])
def test_fused_refuses_modes_the_kernels_do_not_have(bad):
    with pytest.raises(ValueError):
        Fused(**bad)


# --- the reference of the transforms -----------------------------------------------------------


def test_reference_transforms_follow_fla_formulas():
    torch.manual_seed(0)
    H, Hq, K, T = 4, 2, 128, 3
    q, k = torch.randn(1, T, Hq, K), torch.randn(1, T, Hq, K)
    v, g, beta = torch.randn(1, T, H, K), torch.randn(1, T, H, K), torch.randn(1, T, H)
    A_log, dt_bias = torch.rand(H), torch.randn(H * K)
    fq, fk, fg, fb = fused_inputs(q, k, v, g, beta, Fused(True, BETA_SIGMOID2, GATE_SOFTPLUS), A_log, dt_bias)
    assert fq.dtype == torch.float64 and fq.shape == (1, T, H, K)
    assert torch.allclose(fq.norm(dim=-1), torch.ones(1, T, H, dtype=torch.float64), atol=1e-6)
    assert torch.equal(fq[:, :, 0], fq[:, :, 1]) and torch.equal(fk[:, :, 2], fk[:, :, 3])  # heads 0,1 share q/k head 0
    t, h, key = 1, 3, 5
    x = g[0, t, h, key].item() + dt_bias[h * K + key].item()
    assert fg[0, t, h, key].item() == pytest.approx(-math.exp(A_log[h].item()) * math.log1p(math.exp(x)), rel=1e-6)
    assert fb[0, t, h].item() == pytest.approx(2 / (1 + math.exp(-beta[0, t, h].item())), rel=1e-6)
    _, _, bg, _ = fused_inputs(q, k, v, g, beta, Fused(gate_mode=GATE_LOWER_BOUND, lower_bound=-5.0), None, dt_bias)
    assert bg[0, t, h, key].item() == pytest.approx(-5 / (1 + math.exp(-x)), rel=1e-6)


def test_reference_without_transforms_is_the_inputs():
    x, _ = make_inputs(1, 8, 2)
    out = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], NONE)
    assert all(torch.equal(a, b.double()) for a, b in zip(out, (x["q"], x["k"], x["g"], x["beta"])))


def test_gate_parameters_that_are_not_tensors_are_named():
    with pytest.raises(ValueError, match="A_log must be a torch.Tensor, got list"):
        validate_fused(Fused(gate_mode=GATE_SOFTPLUS), [0.0, 0.0], None, _problem(), torch.device("cpu"), require_cuda=False)
