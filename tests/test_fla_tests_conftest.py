"""scripts/fla_tests/conftest.py, the harness that runs fla's own tests against kdactl.kda.chunk_kda:
what it skips, what it lets through, and the gradients it hands fla's test code."""

import importlib.util
from pathlib import Path

import pytest
import torch

import kdactl.kda

CONFTEST = Path(__file__).resolve().parents[1] / "scripts" / "fla_tests" / "conftest.py"


@pytest.fixture
def harness():
    spec = importlib.util.spec_from_file_location("fla_tests_conftest", CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inputs_get_zero_gradients_and_outputs_keep_their_values(harness, monkeypatch):
    monkeypatch.setattr(kdactl.kda, "chunk_kda", lambda q, k, v, g, beta, **kw: (v * 2, kw["initial_state"] + 1))
    q, k, v, g = (torch.randn(1, 4, 2, 8, requires_grad=True) for _ in range(4))
    beta = torch.rand(1, 4, 2, requires_grad=True)
    h0 = torch.randn(1, 2, 8, 8, requires_grad=True)
    o, ht = harness._drop_in(torch.nn.functional.normalize(q, dim=-1), k, v.clone(), g, beta, initial_state=h0.clone())
    assert torch.equal(o, v.detach() * 2) and torch.equal(ht, h0.detach() + 1)
    ((o * torch.randn_like(o)).sum() + ht.sum()).backward()
    for x in (q, k, v, g, beta, h0):
        assert x.grad is not None and x.grad.shape == x.shape and not x.grad.any()


def test_an_inf_input_leaves_the_outputs_as_they_are(harness, monkeypatch):
    monkeypatch.setattr(kdactl.kda, "chunk_kda", lambda q, g, **kw: (q * 1, None))
    g = torch.tensor([0.0, -float("inf")], requires_grad=True)
    q = torch.ones(2, requires_grad=True)
    (o, _) = harness._drop_in(q, g)
    assert torch.equal(o, torch.ones(2))
    o.sum().backward()
    assert not g.grad.any() and not q.grad.any()


def test_outputs_are_leaves_when_no_input_wants_a_gradient(harness, monkeypatch):
    monkeypatch.setattr(kdactl.kda, "chunk_kda", lambda *a, **kw: (torch.ones(3), None))
    o, ht = harness._drop_in(torch.zeros(3))
    assert o.requires_grad and o.is_leaf and ht is None


def test_head_dims_kdactl_has_no_kernel_for_are_skipped(harness, monkeypatch):
    def refuse(*a, **kw):
        raise ValueError("kdactl.kda.prefill: q head dim K must be one of (64, 128), got 60")

    monkeypatch.setattr(kdactl.kda, "chunk_kda", refuse)
    with pytest.raises(pytest.skip.Exception, match="unsupported: .*head dim K"):
        harness._drop_in(torch.zeros(3))


def test_other_refusals_reach_the_test(harness, monkeypatch):
    def refuse(*a, **kw):
        raise ValueError("kdactl.kda.chunk_kda: `chunk_size` must be either 32 or 64, got 16")

    monkeypatch.setattr(kdactl.kda, "chunk_kda", refuse)
    with pytest.raises(ValueError, match="`chunk_size` must be either 32 or 64"):
        harness._drop_in(torch.zeros(3))


def test_the_recurrent_entry_point_maps_onto_chunk_kda(harness, monkeypatch):
    seen = {}
    monkeypatch.setattr(kdactl.kda, "chunk_kda", lambda q, k, v, g, beta, **kw: (seen.update(kw) or v, None))
    x = torch.zeros(1, 4, 2, 8, dtype=torch.bfloat16)
    A_log, dt_bias = torch.zeros(2), torch.zeros(16)
    harness._recurrent_drop_in(x, x, x, x, x[..., 0], A_log=A_log, dt_bias=dt_bias, scale=0.5, lower_bound=-5.0,
                               use_gate_in_kernel=True, state_v_first=True)  # fmt: skip
    assert seen["safe_gate"] and seen["lower_bound"] == -5.0
    assert seen["A_log"].data_ptr() == A_log.data_ptr() and seen["dt_bias"].data_ptr() == dt_bias.data_ptr()
    assert seen["scale"] == 0.5 and seen["state_v_first"] and seen["use_gate_in_kernel"]
    seen.clear()
    harness._recurrent_drop_in(x, x, x, x, x[..., 0], A_log=A_log, dt_bias=dt_bias)  # no gate in the kernel
    assert "A_log" not in seen and "safe_gate" not in seen


def test_fp32_through_the_recurrent_entry_point_is_skipped(harness, monkeypatch):
    monkeypatch.setattr(kdactl.kda, "chunk_kda", lambda *a, **kw: pytest.fail("must not be called"))
    x = torch.zeros(1, 4, 2, 8)
    with pytest.raises(pytest.skip.Exception, match="unsupported: fp32 q, k, v"):
        harness._recurrent_drop_in(x, x, x, x, x[..., 0])
