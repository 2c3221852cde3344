"""The peer adapters on the CPU, with stand-in fla, flash_kda and cudnn modules that compute the
reference's math (or get it wrong on purpose): what each peer is called with in each configuration,
that its results are checked in kdactl's layout, and that a missing or unsupporting peer is a note."""

import dataclasses
import os
import sys
import types

import pytest
import torch

from kdactl.bench import candidates as cand
from kdactl.bench import peers
from kdactl.bench.configs import LOWER_BOUND, PLAIN, SOFTPLUS
from kdactl.bench.model import REJECTED, UNAVAILABLE
from kdactl.bench.suites import fixed, varlen
from kdactl.reference import kda_chunked

CPU = torch.device("cpu")


def _inputs(shape, config=PLAIN):
    x = cand.make_inputs(dataclasses.replace(shape, config=config.name), CPU)
    return x, cand.reference(x)


def _true_result(x, state_v_first):
    """What a correct peer returns for inputs ``x``: o in v's dtype, the state in its layout."""
    o, s = kda_chunked(**cand.recurrence_inputs(x), cu_seqlens=x["cu_seqlens"])
    return o.to(torch.bfloat16), s.transpose(-1, -2) if state_v_first else s


def _install(monkeypatch, name, **attrs):
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


def _fake_fla(monkeypatch, inputs, chunk_scale=1.0):
    calls = []

    def chunk_kda(q, k, v, g, beta, output_final_state, cu_seqlens, cu_seqlens_cpu, **flags):  # fla 0.6.0 takes the host copy
        assert cu_seqlens_cpu is None if cu_seqlens is None else cu_seqlens_cpu.device.type == "cpu"
        calls.append(("chunk", flags))
        o, s = _true_result(inputs, flags.get("state_v_first", False))
        return o * chunk_scale, s

    def fused_recurrent_kda(q, k, v, g, beta, output_final_state, cu_seqlens, **flags):
        calls.append(("recurrent", flags))
        return _true_result(inputs, flags.get("state_v_first", False))

    fla = _install(monkeypatch, "fla", __version__="9.9")
    ops = _install(monkeypatch, "fla.ops")
    kda = _install(monkeypatch, "fla.ops.kda", chunk_kda=chunk_kda, fused_recurrent_kda=fused_recurrent_kda)
    fla.ops, ops.kda = ops, kda
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    return calls


def test_fla_peers_are_checked_and_flashkda_is_off(monkeypatch):
    x, ref = _inputs(varlen((7, 9), 2))
    calls = _fake_fla(monkeypatch, x, chunk_scale=1.5)  # chunk_kda is wrong, fused_recurrent_kda right
    got = {c.name: c for c in peers.peer_candidates(x, ref, ["fla"])}
    assert set(got) == {"fla.chunk_kda", "fla.fused_recurrent_kda"}
    assert os.environ["FLA_FLASH_KDA"] == "0"
    assert not got["fla.chunk_kda"].check().ok
    good = got["fla.fused_recurrent_kda"].check()
    assert good.ok and good.o_err < 5e-3
    assert calls == [("chunk", {}), ("recurrent", {})]  # plain: no in-kernel flags
    assert peers.peer_candidates(x, ref, []) == []


def test_fla_gets_the_lower_bound_flags_and_its_v_first_state_is_compared(monkeypatch):
    x, ref = _inputs(fixed(1, 20, 2), LOWER_BOUND)
    calls = _fake_fla(monkeypatch, x)
    got = peers.peer_candidates(x, ref, ["fla"])
    assert all(c.check().ok for c in got)
    (_, chunk), (_, rec) = calls
    assert chunk["A_log"] is x["A_log"] and chunk["dt_bias"] is x["dt_bias"]
    assert chunk["lower_bound"] == -5.0 and chunk["safe_gate"] is True and chunk["state_v_first"] is True
    assert chunk["use_gate_in_kernel"] and chunk["use_qk_l2norm_in_kernel"] and chunk["use_beta_sigmoid_in_kernel"]
    assert "safe_gate" not in rec and rec["lower_bound"] == -5.0  # the recurrent kernel has no safe_gate


def test_softplus_config_asks_fla_for_the_unbounded_gate(monkeypatch):
    x, ref = _inputs(fixed(1, 20, 2), SOFTPLUS)
    calls = _fake_fla(monkeypatch, x)
    assert all(c.check().ok for c in peers.peer_candidates(x, ref, ["fla"]))
    flags = calls[0][1]
    assert flags["use_gate_in_kernel"] and "lower_bound" not in flags and "state_v_first" not in flags


def test_missing_peers_are_unavailable_notes(monkeypatch):
    for name in ("fla", "flash_kda", "cudnn"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    x, ref = _inputs(fixed(1, 16, 1), LOWER_BOUND)
    out = {c.name: c for c in peers.peer_candidates(x, ref, ["fla", "flashkda", "cudnn"])}
    assert set(out) == {"fla.chunk_kda", "fla.fused_recurrent_kda", "flashkda.fwd", "cudnn.kda_hopper_cuda"}
    assert all(c.reason_status == UNAVAILABLE and c.run is None for c in out.values())
    assert out["flashkda.fwd"].reason.startswith("flashkda: not importable: ")
    assert out["cudnn.kda_hopper_cuda"].reason.startswith("cudnn: not importable: ")
    assert out["fla.chunk_kda"].reason.startswith("fla: not importable: ")


@pytest.mark.parametrize("config", [PLAIN, SOFTPLUS])
def test_flashkda_computes_only_the_lower_bound_config(monkeypatch, config):
    _install(monkeypatch, "flash_kda", fwd=lambda *a, **k: pytest.fail("must not be called"))
    x, ref = _inputs(fixed(1, 16, 1), config)
    (c,) = peers.peer_candidates(x, ref, ["flashkda"])
    assert c.reason_status == REJECTED and c.run is None
    assert f"unsupported configuration {config.name}" in c.reason


def test_flashkda_is_called_with_the_same_math_and_checked(monkeypatch):
    x, ref = _inputs(varlen((9, 23), 2), LOWER_BOUND)
    seen = {}

    def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None, cu_seqlens=None):
        seen.update(scale=scale, dt_bias=tuple(dt_bias.shape), lower_bound=lower_bound, state=tuple(final_state.shape),
                    cu=cu_seqlens.dtype, g=g.dtype, beta=beta.dtype, initial_state=initial_state)
        o, s = _true_result(x, state_v_first=True)
        out.copy_(o)
        final_state.copy_(s)

    _install(monkeypatch, "flash_kda", fwd=fwd)
    (c,) = peers.peer_candidates(x, ref, ["flashkda"])
    assert c.check().ok
    assert seen == dict(scale=128**-0.5, dt_bias=(2, 128), lower_bound=-5.0, state=(2, 2, 128, 128), cu=torch.int64,
                        g=torch.bfloat16, beta=torch.bfloat16, initial_state=None)


def test_flashkda_output_left_unwritten_fails_the_check(monkeypatch):
    x, ref = _inputs(fixed(1, 16, 1), LOWER_BOUND)
    _install(monkeypatch, "flash_kda", fwd=lambda *a, **k: None)  # writes nothing
    (c,) = peers.peer_candidates(x, ref, ["flashkda"])
    assert not c.check().ok


def _fake_cudnn(monkeypatch, inputs, seen):
    def kimi_delta_attention(q, k, v, g, beta, cu_seqlens, output_final_state, plan_name, **kw):
        seen.update(kw, q=tuple(q.shape), g=g.dtype, beta=beta.dtype, cu=cu_seqlens.tolist(), cu_dtype=cu_seqlens.dtype,
                    plan=plan_name)  # fmt: skip
        o, s = _true_result(inputs, state_v_first=True)  # THD o, V-first state, as cuDNN returns them
        return o.reshape(-1, *o.shape[2:]), s

    root = _install(monkeypatch, "cudnn")
    root.linear_attention = _install(monkeypatch, "cudnn.linear_attention", kimi_delta_attention=kimi_delta_attention)


def test_cudnn_takes_thd_fp32_gate_and_int32_bounds(monkeypatch):
    x, ref = _inputs(fixed(2, 16, 2), LOWER_BOUND)
    seen = {}
    _fake_cudnn(monkeypatch, x, seen)
    (c,) = peers.peer_candidates(x, ref, ["cudnn"])
    assert c.check().ok
    assert seen["q"] == (32, 2, 128) and seen["cu"] == [0, 16, 32] and seen["cu_dtype"] == torch.int32
    assert seen["g"] == seen["beta"] == torch.float32  # converted before the timed call, not inside it
    assert seen["plan"] == "kda_hopper_cuda" and seen["safe_gate"] and seen["gate_lower_bound"] == -5.0
    assert seen["use_qk_l2norm_in_kernel"] and seen["use_beta_sigmoid_in_kernel"] and seen["a_log"] is x["A_log"]


def test_cudnn_plain_passes_log_gate_and_rejects_softplus(monkeypatch):
    x, ref = _inputs(varlen((5, 11), 1))
    seen = {}
    _fake_cudnn(monkeypatch, x, seen)
    (c,) = peers.peer_candidates(x, ref, ["cudnn"])
    assert c.check().ok and seen["cu"] == [0, 5, 16]
    assert "safe_gate" not in seen and not seen["use_qk_l2norm_in_kernel"] and not seen["use_beta_sigmoid_in_kernel"]
    x, ref = _inputs(fixed(1, 16, 1), SOFTPLUS)
    (c,) = peers.peer_candidates(x, ref, ["cudnn"])
    assert c.reason_status == REJECTED and "unsupported configuration softplus" in c.reason


def test_fla_chunk_peer_is_chunk_kda_alone(monkeypatch):
    """fla-chunk times fla's chunk_kda without the token-serial fused_recurrent_kda."""
    monkeypatch.setattr(peers, "load_fla", lambda: (_ for _ in ()).throw(ImportError("no fla here")))
    out = peers.peer_candidates({"config": None}, None, ["fla-chunk"])
    assert [c.name for c in out] == ["fla.chunk_kda"] and "no fla here" in out[0].reason
