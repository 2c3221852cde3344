"""The GPU-side helpers that also run on the CPU: inputs, the reference with its self-check and
the device-side error ratio, in every configuration."""

import dataclasses

import pytest
import torch

from kdactl.bench import candidates as cand
from kdactl.bench.suites import fixed, varlen
from kdactl.bench.timing import MIB, flush_bytes_for
from kdactl.bench.configs import LOWER_BOUND, SOFTPLUS
from kdactl.reference import error_ratio, kda_chunked, kda_recurrent

CPU = torch.device("cpu")


def test_inputs_are_realistic_and_deterministic():
    s = fixed(1, 32, 2)
    x = cand.make_inputs(s, CPU)
    assert x["q"].dtype == x["k"].dtype == x["v"].dtype == torch.bfloat16
    assert x["g"].dtype == torch.float32 and x["beta"].dtype == torch.bfloat16
    assert torch.allclose(x["k"].float().norm(dim=-1), torch.ones(1, 32, 2), atol=1e-2)  # L2-normalized
    assert torch.allclose(x["q"].float().norm(dim=-1), torch.ones(1, 32, 2), atol=1e-2)
    assert (x["g"] < 0).all() and (x["beta"] > 0).all() and (x["beta"] < 1).all()
    assert x["cu_seqlens"] is None
    assert torch.equal(cand.make_inputs(s, CPU)["v"], x["v"])
    assert not torch.equal(cand.make_inputs(fixed(1, 32, 2, 128, 128), CPU)["v"], cand.make_inputs(fixed(1, 33, 2), CPU)["v"][:, :32])


def test_varlen_inputs_and_reference():
    s = varlen((5, 0, 20), 2)
    x = cand.make_inputs(s, CPU)
    assert x["cu_seqlens"].tolist() == [0, 5, 5, 25] and x["cu_seqlens"].dtype == torch.int64
    o, state = cand.reference(x)
    assert o.shape == (1, 25, 2, 128) and state.shape == (3, 2, 128, 128)
    assert torch.count_nonzero(state[1]) == 0  # the empty sequence keeps a zero state


def test_reference_self_check_catches_a_broken_reference(monkeypatch):
    import kdactl.reference as ref

    monkeypatch.setattr(ref, "kda_chunked", lambda *a, **k: tuple(t * 1.1 for t in kda_chunked(*a, **k)))
    with pytest.raises(RuntimeError, match="reference self-check failed"):
        cand.reference(cand.make_inputs(fixed(1, 16, 1), CPU))


@pytest.mark.parametrize("config", [LOWER_BOUND, SOFTPLUS])
def test_raw_logit_inputs_and_their_reference(config):
    s = dataclasses.replace(varlen((20, 0, 9), 2), config=config.name)
    x = cand.make_inputs(s, CPU)
    assert x["config"] is config
    assert x["g"].dtype == x["beta"].dtype == torch.bfloat16 and (x["g"] > 0).any() and (x["beta"] < 0).any()  # logits
    assert x["q"].float().norm(dim=-1).mean() > 5  # raw projections: the kernel normalizes
    a = x["A_log"].exp()
    assert x["A_log"].shape == (2,) and ((a >= 1) & (a <= 16)).all()
    assert x["dt_bias"].shape == (2 * 128,) and x["dt_bias"].dtype == torch.float32
    o, state = cand.reference(x)
    # The reference applies the configuration's transforms: the fp64 recurrence on hand-made ones agrees.
    q, k = (torch.nn.functional.normalize(x[n].double(), dim=-1, eps=0) for n in ("q", "k"))
    z = x["g"].double() + x["dt_bias"].double().view(2, 128)
    if config is LOWER_BOUND:
        g = -5 * torch.sigmoid(a.double()[:, None] * z)
    else:
        g = -a.double()[:, None] * torch.nn.functional.softplus(z)
    o64, s64 = kda_recurrent(q, k, x["v"], g, torch.sigmoid(x["beta"].double()), cu_seqlens=x["cu_seqlens"])
    assert error_ratio(o64, o) < 1e-4 and error_ratio(s64, state) < 1e-4


def test_error_ratio_is_the_spec_measure():
    ref, x = torch.randn(4, 8), torch.randn(4, 8)
    want = ((ref.double() - x.double()).square().mean().sqrt() / ref.double().square().mean().sqrt()).item()
    assert error_ratio(ref, x) == pytest.approx(want)
    bad = x.clone()
    bad[0, 0] = float("nan")
    assert error_ratio(ref, bad) == float("inf")
    assert error_ratio(ref, None) == float("inf")
    assert error_ratio(ref, x[:2]) == float("inf")


def test_flush_is_at_least_twice_l2():
    assert flush_bytes_for(50 * MIB) == 100 * MIB
    assert flush_bytes_for(60 * MIB + 1) >= 120 * MIB + 2
    assert flush_bytes_for(0) >= 2 * 128 * MIB and flush_bytes_for(None) > 0


def test_auto_in_a_fused_config_is_called_as_an_engine_calls_fla(monkeypatch):
    import kdactl.kda as kda

    seen = {}
    monkeypatch.setattr(kda, "chunk_kda", lambda *args, **kw: seen.update(kw, nargs=len(args)) or ("o", "s"))
    x = cand.make_inputs(dataclasses.replace(varlen((5, 7), 2), config=LOWER_BOUND.name), CPU)
    assert cand._engine_call(x, LOWER_BOUND)() == ("o", "s")
    assert seen["nargs"] == 5 and seen["A_log"] is x["A_log"] and seen["dt_bias"] is x["dt_bias"]
    assert seen["cu_seqlens_cpu"].device.type == "cpu" and seen["output_final_state"]
    assert {k: seen[k] for k in LOWER_BOUND.fla_flags()} == LOWER_BOUND.fla_flags()
    assert seen["state_v_first"] and seen["safe_gate"] and seen["lower_bound"] == -5.0


def test_gate_params_draw_as_said():
    """test: exp(A_log) in [1, 16), dt_bias N(0, 1); init: dt_bias = softplus^-1(dt), dt in [1e-3, 0.1];
    flashkda: A_log and dt_bias in [0, 1). The draw decides the decay of the lower-bound gate: with
    fla's test draw some key channel of almost every token barely decays, at the layer's init every
    channel decays little, with FlashKDA's every channel decays."""
    def draw(params):
        shape = dataclasses.replace(fixed(1, 64, 8), config=LOWER_BOUND.name, gate_params=params)
        return cand.make_inputs(shape, CPU)

    x = {params: draw(params) for params in ("test", "init", "flashkda")}
    for params in ("test", "init"):
        assert (x[params]["A_log"].exp() >= 1).all() and (x[params]["A_log"].exp() < 16).all()
    assert x["test"]["dt_bias"].min() < 0 < x["test"]["dt_bias"].max()
    dt = torch.nn.functional.softplus(x["init"]["dt_bias"].double())
    assert dt.min() >= 1e-3 * (1 - 1e-6) and dt.max() <= 0.1 * (1 + 1e-6)
    assert (x["flashkda"]["A_log"] >= 0).all() and (x["flashkda"]["A_log"] < 1).all()
    assert (x["flashkda"]["dt_bias"] >= 0).all() and (x["flashkda"]["dt_bias"] < 1).all()
    assert x["flashkda"]["dt_bias"].shape == (8 * 128,)
    g = {params: cand.recurrence_inputs(x[params])["g"] for params in x}
    least_decay = {params: g[params].max(dim=-1).values.mean() for params in g}  # each token's weakest channel
    assert least_decay["test"] > -0.01 and least_decay["init"] > -0.01 and least_decay["flashkda"] < -0.1, least_decay
    assert g["init"].mean() > g["test"].mean()  # weaker decay on average at init
