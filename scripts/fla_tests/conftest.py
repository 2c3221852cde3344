"""Runs flash-linear-attention's own tests/ops/test_kda.py (fla 0.6.0) against kdactl.kda.chunk_kda.

fla's test file is not part of this repository: copy this conftest beside a copy of it and run
pytest there with fla installed (scripts/gpu_visit.sh, section fla-tests):

    pytest -k "(test_chunk or test_fused_recurrent) and not vllm_decode" <folder>/test_kda.py

Every ``chunk_kda`` the test module calls becomes kdactl's. kdactl computes no gradients, so the
forward assertions (o, ht) judge kdactl and the gradient ones are recorded as not run. The test's
backward still runs: kdactl's outputs hang off the call's inputs through an autograd step that hands
every input a zero gradient. Some tests do arithmetic on those gradients (transpose them, scale them)
before their forward assertions, which a None gradient would stop; the zeros are never asserted.
A case kdactl refuses by design (ValueError: a head dim it has no kernel for) is skipped with the
reason "unsupported: ...", so passed / failed / unsupported are counted apart; any other ValueError
reaches the test, whose pytest.raises may be waiting for it (fla's chunk_size message).

fla's ``fused_recurrent_kda`` is replaced too, by kdactl's prefill through the same drop-in: its
arguments are chunk_kda's, and its gate with ``lower_bound`` is chunk_kda's ``safe_gate``. fp32 q, k, v
through it are skipped as unsupported: kdactl's kernels read 16-bit ones (chunk_kda rounds fp32 to
bf16), which fla's fp32 tolerances were not set for. fla's decode tests call its own
``fused_recurrent_kda_fwd`` (a state pool, a final state written in place) and are not kdactl's.
"""

from __future__ import annotations

import pytest
import torch

FORWARD = ("o", "ht")  # what fla's assert_close names for the forward outputs
UNSUPPORTED = ("head dim",)  # kdactl's refusals of cases fla runs: reported as unsupported, not failed


def _drop_in(*args, **kwargs):
    import kdactl.kda as kda

    def plain(x):
        return x.detach() if isinstance(x, torch.Tensor) else x

    with torch.no_grad():
        try:
            out = kda.chunk_kda(*map(plain, args), **{n: plain(x) for n, x in kwargs.items()})
        except ValueError as err:
            if not any(reason in str(err) for reason in UNSUPPORTED):
                raise
            pytest.skip(f"unsupported: {err}")
    return tuple(zero_gradients(x, (*args, *kwargs.values())) for x in out)


def _recurrent_drop_in(q, k, v, g, beta, A_log=None, dt_bias=None, lower_bound=None, **kwargs):
    """fla's fused_recurrent_kda (its public entry point: no state pool, no final state in place) as
    kdactl's prefill, through chunk_kda's arguments."""
    if q.dtype == torch.float32:
        pytest.skip("unsupported: fp32 q, k, v through a recurrent entry point (kdactl's kernels read 16-bit)")
    gate = {"A_log": A_log, "dt_bias": dt_bias} if kwargs.get("use_gate_in_kernel") else {}
    if lower_bound is not None:
        gate.update(safe_gate=True, lower_bound=lower_bound)
    return _drop_in(q, k, v, g, beta, **gate, **kwargs)


def zero_gradients(out, inputs):
    """``out`` with a zero gradient to every input that wants one (a leaf when none does)."""
    if not (isinstance(out, torch.Tensor) and out.is_floating_point()):
        return out
    wanting = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    return _ZeroGradients.apply(out, *wanting) if wanting else out.requires_grad_()


class _ZeroGradients(torch.autograd.Function):
    """out's values as they are (not out + 0 * sum(inputs), which an inf input would turn to NaN)."""

    @staticmethod
    def forward(ctx, out, *inputs):
        ctx.inputs = [(x.shape, x.dtype, x.device) for x in inputs]
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        return (None, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.inputs))


@pytest.fixture(autouse=True)
def kdactl_chunk_kda(request, monkeypatch):
    module = request.module
    if not hasattr(module, "chunk_kda"):
        return
    monkeypatch.setattr(module, "chunk_kda", _drop_in)
    if hasattr(module, "fused_recurrent_kda"):
        monkeypatch.setattr(module, "fused_recurrent_kda", _recurrent_drop_in)
    fla_assert_close = module.assert_close
    skipped = []

    def forward_only(prefix, ref, tri, ratio, *args, **kwargs):
        if prefix in FORWARD:
            return fla_assert_close(prefix, ref, tri, ratio, *args, **kwargs)
        skipped.append(prefix)

    monkeypatch.setattr(module, "assert_close", forward_only)
    yield
    if skipped:
        print(f"kdactl: gradient assertions not run (no backward): {', '.join(skipped)}")
