"""Route "small_bh" on the GPU: the segmented recurrence against the fp64 reference (short and
medium T, where its plan still cuts several segments), against the direct route at T = 131072 and
1048576 (and the fp64 reference on their first 8192 tokens), on a side stream and in a CUDA graph."""

import pytest
import torch

from kdactl.kda import KdaWorkspace, prefill, select_route
from kdactl.kda.device import device_info
from kdactl.kda.problem import KdaProblem
from kdactl.kda.inputs import random_inputs
from kdactl.kda.routes import small_bh_plan
from kdactl.kernel_abi import SMALL_BH_MAX_UNSTITCHED
from kdactl.reference import error_ratio, kda_recurrent
from kdactl.smoke import replay_equals_eager
from tests.kda_inputs import carried_history_inputs, make_inputs
from tests.test_kda_gpu import TOL, _check

pytestmark = pytest.mark.gpu


def _segments(B, T, H, D=128):
    return small_bh_plan(KdaProblem(B, T, H, D, D, B, False, False, False), device_info(0)).segments


@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("T", [64, 97, 1000, 4096, 8192], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("H", [1, 2, 8, 16], ids=lambda h: f"H{h}")
def test_small_bh_fixed_B1(H, T, with_state):
    assert _segments(1, T, H) >= 2  # the plan really cuts this sequence
    x, s0 = make_inputs(1, T, H, device="cuda", state_n=1 if with_state else None, seed=H * 7919 + T)
    _check(x, s0, route="small_bh")


@pytest.mark.parametrize(
    "B,T,H,D,gdt,bdt",
    [
        (2, 3000, 2, 128, torch.float32, torch.float32),
        (3, 1029, 3, 128, torch.bfloat16, torch.bfloat16),
        (2, 2057, 4, 64, torch.float32, torch.bfloat16),
    ],
    ids=["B2-T3000-H2", "B3-T1029-H3-bf16", "B2-T2057-H4-D64"],
)
def test_small_bh_batched(B, T, H, D, gdt, bdt):
    assert _segments(B, T, H, D) >= 2
    x, s0 = make_inputs(B, T, H, K=D, V=D, device="cuda", g_dtype=gdt, beta_dtype=bdt, state_n=B, seed=B + T)
    _check(x, s0, route="small_bh", scale=0.1)


@pytest.mark.parametrize("g_range", [(-8.0, 0.0), (-0.01, 0.0), None], ids=["g-8..0", "g-0.01..0", "logsigmoid"])
def test_small_bh_gates(g_range):
    x, s0 = make_inputs(1, 6000, 2, device="cuda", state_n=1, g_range=g_range, seed=12)
    _check(x, s0, route="small_bh")


@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
def test_small_bh_warm_and_stitched_segments_in_one_sequence(with_state):
    """Strong decay (warm starts) in the first half of each sequence, almost none (stitched starts)
    in the second, and the stitch's steps between them."""
    x, s0 = make_inputs(2, 8192, 2, device="cuda", state_n=2 if with_state else None, g_range=(-8.0, 0.0), seed=21)
    x["g"][:, 4096:] *= 1e-3
    assert _segments(2, 8192, 2) >= 4
    _check(x, s0, route="small_bh")


@pytest.mark.parametrize("gates", ["warm", "warm-then-cold"])
def test_small_bh_walks_known_segments_in_two_halves(gates):
    """Where the reduction's grid (E and M slots) fits one wave, a known segment whose middle starts warm
    is walked in two halves at once (Segments::halves): against fp64 with an initial state, and the
    halved segments counted from the call's bounds (kdactl.kda.segments, as bench reports them)."""
    from kdactl.kda.routes import small_bh_halves
    from kdactl.kda.segments import starts_of_call

    T, H = 8192, 1
    p, dev = KdaProblem(1, T, H, 128, 128, 1, False, False, False), device_info(0)
    assert _segments(1, T, H) > SMALL_BH_MAX_UNSTITCHED and small_bh_halves(p, dev)
    x, s0 = make_inputs(1, T, H, device="cuda", state_n=1, g_range=(-8.0, 0.0), seed=41)
    if gates == "warm-then-cold":
        x["g"][:, 4096:] *= 1e-3
    ws = KdaWorkspace("cuda")
    _check(x, s0, route="small_bh", workspace=ws)
    starts = starts_of_call(ws.buffer, p, dev, [T])
    segments = _segments(1, T, H)
    if gates == "warm":
        assert starts.halved == segments and starts.stitched == 0, starts
    else:
        assert 0 < starts.halved < segments and starts.stitched > 0, starts


def _unstitched_heads(D):
    """A head count whose B1 T8192 plan has 2 to SMALL_BH_MAX_UNSTITCHED segments on this GPU."""
    return next(H for H in (16, 24, 32, 48, 64, 96, 128) if 2 <= _segments(1, 8192, H, D) <= SMALL_BH_MAX_UNSTITCHED)


@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("gates", ["warm", "cold", "warm-then-cold", "cold-then-warm"])
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_small_bh_walks_on_where_it_does_not_stitch(D, gates, with_state):
    """A sequence of at most SMALL_BH_MAX_UNSTITCHED segments is not stitched: a segment that does not
    start warm is walked on by the CTA of the one before it (every segment by segment 0's where nothing
    decays, the later ones or the middle ones where the decay stops or starts halfway)."""
    H = _unstitched_heads(D)
    x, s0 = make_inputs(1, 8192, H, K=D, V=D, device="cuda", state_n=1 if with_state else None,
                        g_range=(-0.01, 0.0) if gates == "cold" else (-8.0, 0.0), seed=H + D)  # fmt: skip
    if gates == "warm-then-cold":
        x["g"][:, 4096:] *= 1e-3
    elif gates == "cold-then-warm":
        x["g"][:, :4096] *= 1e-3
    _check(x, s0, route="small_bh")


def test_small_bh_history_that_every_channel_forgets_but_the_state_keeps():
    """carried_history_inputs: each chunk decays every key channel by e^-40 and still keeps a quarter
    of the state. A warm start taken on a bound per channel would drop that history and miss o."""
    x = carried_history_inputs(8192, H=2, device="cuda")
    s0 = torch.randn(1, 2, 128, 128, device="cuda")
    assert _segments(1, 8192, 2) >= 4
    _check(x, s0, route="small_bh")


@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("T", [131072, 1048576], ids=lambda t: f"T{t}")
def test_small_bh_long_matches_direct_and_reference_prefix(T, with_state):
    x, s0 = make_inputs(1, T, 1, device="cuda", state_n=1 if with_state else None, seed=T + with_state)
    call = dict(initial_state=s0, output_final_state=True)
    o_s, s_s = prefill(**x, **call, route="small_bh")
    o_d, s_d = prefill(**x, **call, route="direct")
    eo, es = error_ratio(o_d, o_s), error_ratio(s_d, s_s)
    prefix = {name: t[:, :8192] for name, t in x.items()}
    o_ref, _ = kda_recurrent(**prefix, initial_state=s0, device="cuda")
    ep = error_ratio(o_ref, o_s[:, :8192])
    print(f"error ratio o={eo:.3e} state={es:.3e} (vs direct); prefix o={ep:.3e} (vs fp64)")
    assert eo <= TOL and es <= TOL and ep <= TOL, f"vs direct o={eo:.2e} state={es:.2e}; prefix vs fp64 {ep:.2e}"


@pytest.mark.parametrize("g_range", [(-8.0, 0.0), (-0.01, 0.0)], ids=["warm", "stitched"])
@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("lengths", [(16384, 512, 300, 1200, 64), (2800, 0, 1296, 17), (5000,)],
                         ids=["one-long", "empty-and-short", "single"])  # fmt: skip
def test_small_bh_varlen(lengths, with_state, g_range):
    """Varlen batches cut by tokens: the long sequence in many segments, short and empty ones whole,
    with warm and with stitched starts, int32 and int64 cu_seqlens."""
    x, s0, cu = random_inputs(1, 0, 2, lengths=lengths, device="cuda", seed=len(lengths), g_range=g_range,
                              with_state=with_state, cu_dtype=torch.int32 if with_state else torch.int64)  # fmt: skip
    _check(x, s0, cu, route="small_bh")


def test_auto_takes_small_bh_for_few_heads_and_matches_forced():
    x, s0 = make_inputs(1, 16384, 4, device="cuda", state_n=1, seed=9)
    p = KdaProblem(1, 16384, 4, 128, 128, 1, False, False, False)
    assert select_route(p, device_info(0)) == "small_bh"
    o_auto, s_auto = prefill(**x, initial_state=s0, output_final_state=True)
    o_f, s_f = prefill(**x, initial_state=s0, output_final_state=True, route="small_bh")
    assert torch.equal(o_auto, o_f) and torch.equal(s_auto, s_f)
    o_c, s_c = prefill(**x, initial_state=s0, output_final_state=True, route="chunk")
    eo, es = error_ratio(o_c, o_f), error_ratio(s_c, s_f)
    assert eo <= TOL and es <= TOL, f"small_bh vs chunk: o={eo:.2e} state={es:.2e}"


def test_small_bh_on_a_side_stream():
    x, s0 = make_inputs(1, 4096, 2, device="cuda", state_n=1, seed=21)
    o_ref, s_ref = prefill(**x, initial_state=s0, output_final_state=True, route="small_bh")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, s = prefill(**x, initial_state=s0, output_final_state=True, route="small_bh")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)


def test_small_bh_graph_capture_with_workspace():
    T, H = 8192, 2
    x, s0 = make_inputs(1, T, H, device="cuda", state_n=1, seed=31)
    o, s = torch.empty_like(x["v"]), torch.empty(1, H, 128, 128, device="cuda")
    ws = KdaWorkspace("cuda")
    call = dict(initial_state=s0, output_final_state=True, out=(o, s), workspace=ws, route="small_bh")
    prefill(**x, **call)  # sizes the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefill(**x, **call)
    for seed in (32, 33):
        fresh = make_inputs(1, T, H, device="cuda", state_n=1, seed=seed)
        replay_equals_eager(graph, x, s0, None, o, s, fresh)
