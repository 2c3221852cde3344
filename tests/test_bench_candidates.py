"""The GPU-side helpers that also run on the CPU: inputs, the reference with its self-check, the
device-side error ratio, and the fla peers (with a stand-in fla module)."""

import sys
import types

import pytest
import torch

from kdactl.bench import candidates as cand
from kdactl.bench.model import UNAVAILABLE
from kdactl.bench.suites import fixed, varlen
from kdactl.bench.timing import MIB, flush_bytes_for
from kdactl.reference import error_ratio, kda_chunked

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


def test_error_ratio_is_the_spec_measure():
    ref, x = torch.randn(4, 8), torch.randn(4, 8)
    want = ((ref.double() - x.double()).square().mean().sqrt() / ref.double().square().mean().sqrt()).item()
    assert error_ratio(ref, x) == pytest.approx(want)
    bad = x.clone()
    bad[0, 0] = float("nan")
    assert error_ratio(ref, bad) == float("inf")
    assert error_ratio(ref, None) == float("inf")
    assert error_ratio(ref, x[:2]) == float("inf")


def _fake_fla(monkeypatch, chunk_scale=1.0):
    calls = []

    def chunk_kda(q, k, v, g, beta, output_final_state, cu_seqlens, cu_seqlens_cpu):  # fla 0.6.0 takes the host copy
        assert cu_seqlens_cpu is None if cu_seqlens is None else cu_seqlens_cpu.device.type == "cpu"
        calls.append("chunk")
        o, s = kda_chunked(q, k, v, g, beta, cu_seqlens=cu_seqlens)
        return (o * chunk_scale).to(torch.bfloat16), s

    def fused_recurrent_kda(q, k, v, g, beta, output_final_state, cu_seqlens):
        calls.append("recurrent")
        o, s = kda_chunked(q, k, v, g, beta, cu_seqlens=cu_seqlens)
        return o.to(torch.bfloat16), s

    fla, ops, kda = (types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.kda"))
    fla.__version__ = "9.9"
    kda.chunk_kda, kda.fused_recurrent_kda = chunk_kda, fused_recurrent_kda
    fla.ops, ops.kda = ops, kda
    for name, mod in (("fla", fla), ("fla.ops", ops), ("fla.ops.kda", kda)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    return calls


def test_fla_peers_are_checked_and_flashkda_is_off(monkeypatch):
    calls = _fake_fla(monkeypatch, chunk_scale=1.5)  # chunk_kda is wrong, fused_recurrent_kda right
    x = cand.make_inputs(varlen((7, 9), 2), CPU)
    ref = cand.reference(x)
    peers = {c.name: c for c in cand.peer_candidates(x, ref, ["fla"])}
    assert set(peers) == {"fla.chunk_kda", "fla.fused_recurrent_kda"}
    import os

    assert os.environ["FLA_FLASH_KDA"] == "0"
    assert not peers["fla.chunk_kda"].check().ok
    good = peers["fla.fused_recurrent_kda"].check()
    assert good.ok and good.o_err < 5e-3
    assert calls == ["chunk", "recurrent"]
    assert cand.peer_candidates(x, ref, []) == []


def test_fla_missing_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla raises ImportError
    out = cand.peer_candidates({}, None, ["fla"])
    assert [c.reason_status for c in out] == [UNAVAILABLE, UNAVAILABLE]
    assert "fla not importable" in out[0].reason


def test_flush_is_at_least_twice_l2():
    assert flush_bytes_for(50 * MIB) == 100 * MIB
    assert flush_bytes_for(60 * MIB + 1) >= 120 * MIB + 2
    assert flush_bytes_for(0) >= 2 * 128 * MIB and flush_bytes_for(None) > 0
