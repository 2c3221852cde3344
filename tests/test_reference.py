"""The fp64 recurrence against hand-computed steps, and the fp32 chunked form against it."""

import pytest
import torch

from kdactl.reference import error_ratio, kda_chunked, kda_recurrent
from tests.kda_inputs import cu_seqlens_of, make_inputs


def test_one_step_matches_hand_math():
    K, V = 3, 2
    q = torch.tensor([[[[1.0, 0.0, 2.0]]]])
    k = torch.tensor([[[[0.6, 0.8, 0.0]]]])
    v = torch.tensor([[[[1.0, -1.0]]]])
    g = torch.tensor([[[[0.0, -0.5, -1.0]]]])
    beta = torch.tensor([[[0.5]]])
    S0 = torch.arange(6, dtype=torch.float64).reshape(1, 1, K, V)
    o, S = kda_recurrent(q, k, v, g, beta, scale=1.0, initial_state=S0)
    D = torch.diag(g[0, 0, 0].double().exp())
    kk = k[0, 0, 0].double()
    expect_S = (torch.eye(K, dtype=torch.float64) - 0.5 * torch.outer(kk, kk)) @ D @ S0[0, 0] + 0.5 * torch.outer(kk, v[0, 0, 0].double())
    torch.testing.assert_close(S[0, 0], expect_S)
    torch.testing.assert_close(o[0, 0, 0], expect_S.T @ q[0, 0, 0].double())


@pytest.mark.parametrize("g_range", [(-1.0, 0.0), (-8.0, 0.0), (-0.01, 0.0), (-20.0, -10.0)], ids=lambda r: f"g{r[0]}..{r[1]}")
@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 37, 3), (1, 70, 1)], ids=lambda s: "B{}-T{}-H{}".format(*s))
def test_chunked_matches_recurrent(shape, g_range):
    B, T, H = shape
    x, s0 = make_inputs(B, T, H, K=16, V=8, state_n=B, g_range=g_range, seed=T)
    o_ref, s_ref = kda_recurrent(**x, initial_state=s0)
    o, s = kda_chunked(**x, initial_state=s0)
    assert error_ratio(o_ref, o) < 1e-5
    assert error_ratio(s_ref, s) < 1e-5


def test_varlen_equals_separate_sequences_including_empty():
    lengths = [5, 0, 19, 1, 0]
    T = sum(lengths)
    x, s0 = make_inputs(1, T, 2, K=16, V=8, state_n=len(lengths), seed=3)
    cu = cu_seqlens_of(lengths)
    o, s = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu)
    for n, (bos, eos) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {name: t[:, bos:eos] for name, t in x.items()}
        o_n, s_n = kda_recurrent(**part, initial_state=s0[n : n + 1])
        torch.testing.assert_close(o[:, bos:eos], o_n)
        torch.testing.assert_close(s[n], s_n[0])
    assert torch.equal(s[1], s0[1].double()), "an empty sequence passes its initial state through"
    o_c, s_c = kda_chunked(**x, initial_state=s0, cu_seqlens=cu)
    assert error_ratio(o, o_c) < 1e-5 and error_ratio(s, s_c) < 1e-5


def test_error_ratio():
    ref = torch.tensor([1.0, -1.0, 1.0, -1.0])
    assert error_ratio(ref, ref) == 0.0
    assert error_ratio(ref, ref * 1.01) == pytest.approx(0.01)
    assert error_ratio(ref, torch.tensor([1.0, float("nan"), 1.0, 1.0])) == float("inf")
    assert error_ratio(torch.zeros(3), torch.ones(3)) == float("inf")


def test_checkpoints_are_the_final_states_of_each_prefix():
    from kdactl.kda.inputs import random_inputs

    lengths = [40, 0, 16]
    x, s0, cu = random_inputs(1, 0, 2, K=16, V=8, lengths=lengths, with_state=True, seed=4)
    _, _, rows = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu, checkpoint_every=16)
    assert rows.shape == (3 + 0 + 1, 2, 16, 8)  # ceil(40/16) + 0 + ceil(16/16)
    assert torch.equal(rows[0], s0[0].double()) and torch.equal(rows[3], s0[2].double())  # before token 0
    for j, prefix in ((1, 16), (2, 32)):
        part = {n: t[:, :prefix] for n, t in x.items()}
        _, final = kda_recurrent(**part, initial_state=s0[:1])
        assert torch.allclose(rows[j], final[0], rtol=0, atol=1e-12)
