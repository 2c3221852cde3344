"""The serving options on the GPU, every route that takes the shape, against the fp64 reference:
fp16 inputs (q, k, v, and g / beta), V-first states, prefix checkpoints, and the fla drop-in's
return_intermediate_states and fp32 inputs."""

import pytest
import torch

from kdactl.kda import KdaWorkspace, chunk_kda, prefill
from kdactl.kda.inputs import random_inputs
from kdactl.reference import ERROR_LIMIT, error_ratio, kda_recurrent

pytestmark = pytest.mark.gpu

# (route, B, T, H, lengths): each route on a shape it takes; small_bh only fixed and long.
CASES = [("direct", 2, 40, 3, (40, 0, 23)), ("chunk", 2, 200, 3, (200, 17, 64)), ("small_bh", 1, 4096, 1, None)]


def _case(route, B, T, H, lengths, varlen, seed=0, **kw):
    x, s0, cu = random_inputs(B, T, H, lengths=lengths if varlen else None, device="cuda", seed=seed,
                              with_state=True, **kw)  # fmt: skip
    return x, s0, cu


def _ids(case):
    return case[0]


def _layouts(case):
    return ("fixed", "varlen") if case[4] is not None else ("fixed",)


LAYOUT_CASES = [pytest.param(c, lay, id=f"{c[0]}-{lay}") for c in CASES for lay in _layouts(c)]


def _assert_close(o_ref, o, s_ref, s, what=""):
    eo, es = error_ratio(o_ref, o), error_ratio(s_ref, s)
    print(f"{what} error ratio o={eo:.3e} state={es:.3e}")
    assert eo <= ERROR_LIMIT and es <= ERROR_LIMIT, f"{what} error ratio o={eo:.2e} state={es:.2e}"


@pytest.mark.parametrize("gate_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("case, layout", LAYOUT_CASES)
def test_fp16_inputs(case, layout, gate_dtype):
    route, B, T, H, lengths = case
    x, s0, cu = _case(route, B, T, H, lengths, layout == "varlen", seed=T, g_dtype=gate_dtype, beta_dtype=gate_dtype)
    x = {n: t.half() if n in "qkv" else t for n, t in x.items()}
    o, s = prefill(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu, route=route)
    assert o.dtype == torch.float16
    o_ref, s_ref = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu, device="cuda")
    _assert_close(o_ref, o, s_ref, s, f"{route} {layout} g={gate_dtype}")


@pytest.mark.parametrize("case, layout", LAYOUT_CASES)
def test_v_first_states(case, layout):
    route, B, T, H, lengths = case
    x, s0, cu = _case(route, B, T, H, lengths, layout == "varlen", seed=T + 1)
    o, s = prefill(**x, initial_state=s0.transpose(-1, -2).contiguous(), output_final_state=True, cu_seqlens=cu,
                   route=route, state_v_first=True)  # fmt: skip
    assert s.shape == s0.transpose(-1, -2).shape
    o_ref, s_ref = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu, device="cuda")
    _assert_close(o_ref, o, s_ref, s.transpose(-1, -2), f"{route} {layout} v-first")


@pytest.mark.parametrize("every, dtype, v_first", [(16, torch.float32, False), (64, torch.bfloat16, True),
                                                   (48, torch.float32, True)])  # fmt: skip
@pytest.mark.parametrize("case, layout", LAYOUT_CASES)
def test_checkpoints(case, layout, every, dtype, v_first):
    route, B, T, H, lengths = case
    x, s0, cu = _case(route, B, T, H, lengths, layout == "varlen", seed=T + every)
    init = s0.transpose(-1, -2).contiguous() if v_first else s0
    o, s, c = prefill(**x, initial_state=init, output_final_state=True, cu_seqlens=cu, route=route,
                      state_v_first=v_first, checkpoint_every=every, checkpoint_dtype=dtype)  # fmt: skip
    o_ref, s_ref, c_ref = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu, device="cuda", checkpoint_every=every)
    rows = c.flatten(0, 1)  # [B, rows, H, ...] -> sequence after sequence, as the reference
    assert c.dtype == dtype and rows.shape[0] == c_ref.shape[0]
    if v_first:
        rows, s = rows.transpose(-1, -2), s.transpose(-1, -2)
    _assert_close(o_ref, o, s_ref, s, f"{route} {layout} every {every}")
    ec = error_ratio(c_ref, rows)
    print(f"checkpoints error ratio {ec:.3e}")
    assert ec <= ERROR_LIMIT, f"checkpoints error ratio {ec:.2e}"


@pytest.mark.parametrize("route", ["direct", "chunk"])
def test_checkpoints_and_v_first_pool_under_graph_replay_equal_eager(route):
    lengths = (40, 7, 100)
    x, _, cu = random_inputs(1, 0, 4, lengths=lengths, device="cuda", seed=9)
    pool0 = torch.randn(5, 4, 128, 128, device="cuda") * 0.5
    idx = torch.tensor([3, -1, 0], dtype=torch.int32, device="cuda")
    kw = dict(cu_seqlens=cu, cu_seqlens_cpu=cu.tolist(), route=route, state_indices=idx, state_v_first=True,
              checkpoint_every=32)  # fmt: skip
    eager_pool = pool0.clone()
    o_eager, _, c_eager = prefill(**x, state_pool=eager_pool, **kw)
    ws, o, c, pool = KdaWorkspace("cuda"), torch.empty_like(x["v"]), torch.empty_like(c_eager), pool0.clone()
    prefill(**x, state_pool=pool, out=o, workspace=ws, checkpoints=c, **kw)  # grows the workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefill(**x, state_pool=pool, out=o, workspace=ws, checkpoints=c, **kw)
    pool.copy_(pool0)
    o.zero_(), c.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o, o_eager) and torch.equal(pool, eager_pool) and torch.equal(c, c_eager)


def test_chunk_kda_intermediate_states_and_fp32_inputs():
    lengths = [130, 64, 1]
    x, s0, cu = random_inputs(1, 0, 2, lengths=lengths, device="cuda", seed=12, with_state=True)
    x32 = {n: t.float() if n in "qkv" else t for n, t in x.items()}
    with torch.inference_mode():
        o, s, h = chunk_kda(**x32, initial_state=s0, output_final_state=True, cu_seqlens=cu.long(),
                            cu_seqlens_cpu=cu.cpu(), return_intermediate_states=True)  # fmt: skip
    assert o.dtype == torch.float32 and h.dtype == torch.bfloat16 and h.shape == (1, 3 + 1 + 1, 2, 128, 128)
    o_ref, s_ref, h_ref = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu, device="cuda", checkpoint_every=64)
    _assert_close(o_ref, o, s_ref, s, "chunk_kda fp32")
    assert error_ratio(h_ref, h[0]) <= ERROR_LIMIT


def test_repeated_calls_are_served_by_kdactl_host():
    """On a node installed as the README says, the planned eager path is the C++ one; its planned
    calls stay correct, and a misaligned call after a plan is still refused by name."""
    from kdactl.kda import plans

    x, s0, cu = random_inputs(1, 64, 4, lengths=(10, 54), device="cuda", with_state=True)
    host = cu.cpu()
    for _ in range(3):
        o, s = prefill(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=host)
    assert plans.host_status().startswith("kdactl_host"), plans.host_status()
    assert plans._HOST.size() >= 1
    o_ref, s_ref = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu)
    _assert_close(o_ref, o, s_ref, s, "planned varlen")
    with pytest.raises(ValueError, match="cu_seqlens must end at T=64"):
        prefill(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=[0, 10, 50])
    flat = torch.empty(x["q"].numel() + 8, dtype=x["q"].dtype, device="cuda")
    x["q"] = flat[1 : 1 + x["q"].numel()].view(x["q"].shape)
    with pytest.raises(ValueError, match="q must be 16-byte aligned"):
        prefill(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=host)
