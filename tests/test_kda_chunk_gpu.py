"""Route "chunk" on the GPU: the fp64 reference's matrix of the direct route, plus long and wide
shapes (held to the direct route where fp64 is too slow), sequences shorter than one chunk, gates
steep enough to take steep_a_p, and graph capture with its workspace."""

import pytest
import torch

from kdactl.kda import KdaWorkspace, prefill
from kdactl.kda.tuning import AUTO, Tuning
from kdactl.reference import error_ratio
from kdactl.smoke import replay_equals_eager
from tests.kda_inputs import cu_seqlens_of, make_inputs
from tests.test_kda_gpu import TOL, _check

pytestmark = pytest.mark.gpu


WARPS_8 = Tuning(warps=8)  # the recurrence in walks of 8 warps (all 128 values of a head), wherever auto would not


@pytest.fixture(params=[AUTO, WARPS_8], ids=["auto", "warps-8"])
def path(request):
    """Route chunk's recurrence as the launcher picks it, and forced to 8-warp walks."""
    return request.param


@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize("T", [1, 17, 64, 97, 1000, 4096], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("H", [1, 4, 12, 32, 64, 96], ids=lambda h: f"H{h}")
def test_chunk_fixed_B1(H, T, with_state, path):
    if H == 96 and T == 4096:
        pytest.skip("covered against the direct route by test_chunk_matches_direct_long_and_wide")
    x, s0 = make_inputs(1, T, H, device="cuda", state_n=1 if with_state else None, seed=H * 7919 + T)
    _check(x, s0, route="chunk", tuning=path)


@pytest.mark.parametrize(
    "B,T,H,D,gdt,bdt",
    [
        (2, 300, 4, 128, torch.float32, torch.float32),
        (3, 129, 12, 128, torch.bfloat16, torch.bfloat16),
        (8, 64, 2, 128, torch.float32, torch.bfloat16),
        (2, 257, 4, 64, torch.float32, torch.float32),
        (4, 100, 3, 64, torch.bfloat16, torch.float32),
    ],
    ids=["B2-T300-H4", "B3-T129-H12-bf16g", "B8-T64-H2-bf16beta", "B2-T257-H4-D64", "B4-T100-H3-D64-bf16g"],
)
def test_chunk_batched(B, T, H, D, gdt, bdt, path):
    x, s0 = make_inputs(B, T, H, K=D, V=D, device="cuda", g_dtype=gdt, beta_dtype=bdt, state_n=B, seed=B + T)
    if path == WARPS_8 and D == 64:  # 8 warps of 16 values each: wider than V
        with pytest.raises(ValueError, match="tuning_warps and tuning_stages name no kernel this route builds"):
            prefill(**x, initial_state=s0, output_final_state=True, route="chunk", tuning=path)
        return
    _check(x, s0, route="chunk", scale=0.1, tuning=path)


@pytest.mark.parametrize("with_state", [False, True], ids=["nostate", "state"])
@pytest.mark.parametrize(
    "lengths",
    [[16], [17, 33, 65], [1300, 547, 2048, 963, 271, 3063], [0, 5, 0, 9], [3, 15, 1, 16, 2, 40]],
    ids=lambda l: "L" + "_".join(map(str, l)),
)
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_chunk_varlen(lengths, with_state, cu_dtype, path):
    N, H = len(lengths), 4
    x, s0 = make_inputs(1, sum(lengths), H, device="cuda", state_n=N if with_state else None, seed=sum(lengths))
    _, s = _check(x, s0, cu_seqlens_of(lengths, "cuda", cu_dtype), route="chunk", tuning=path)
    for n, length in enumerate(lengths):
        if length == 0:
            expect = s0[n] if with_state else torch.zeros_like(s[n])
            assert torch.equal(s[n], expect)


def test_chunk_varlen_longest_first(path):
    """With more recurrence CTAs than SMs (here 4 x 64 x 2 = 512) the kernel runs the sequences
    longest first: every sequence must still get its own output rows and final state."""
    lengths, H = [40, 700, 3, 1200], 64
    x, s0 = make_inputs(1, sum(lengths), H, device="cuda", state_n=len(lengths), seed=7)
    _check(x, s0, cu_seqlens_of(lengths, "cuda", torch.int32), route="chunk", tuning=path)


@pytest.mark.parametrize("g_range", [(-8.0, 0.0), (-0.001, 0.0), (-20.0, -5.0), None],
                         ids=["g-8..0", "g~0", "g-20..-5", "logsigmoid"])  # fmt: skip
def test_chunk_gates(g_range, path):
    """(-8, 0) and (-20, -5) decay past e^-40 within a chunk: A and P take steep_a_p there."""
    x, s0 = make_inputs(1, 513, 4, device="cuda", state_n=1, g_range=g_range, seed=11)
    _check(x, s0, route="chunk", tuning=path)


def test_chunk_weak_decay_long_sequence(path):
    """Gates near 0 forget nothing, so rounding error adds up over the whole sequence: the hardest
    regime for the bf16 operands (tools/chunk_precision.py emulates about 4.4e-3 here)."""
    x, s0 = make_inputs(1, 4096, 2, device="cuda", state_n=1, g_range=(-0.001, 0.0), seed=3)
    _check(x, s0, route="chunk", tuning=path)


@pytest.mark.parametrize("B,T,H", [(1, 65536, 2), (1, 4096, 96), (2, 8192, 8)], ids=["T65536", "H96", "B2-T8192"])
def test_chunk_matches_direct_long_and_wide(B, T, H, path):
    x, s0 = make_inputs(B, T, H, device="cuda", state_n=B, seed=T + H)
    o_d, s_d = prefill(**x, initial_state=s0, output_final_state=True, route="direct")
    o_c, s_c = prefill(**x, initial_state=s0, output_final_state=True, route="chunk", tuning=path)
    eo, es = error_ratio(o_d, o_c), error_ratio(s_d, s_c)
    assert eo <= TOL and es <= TOL, f"chunk vs direct: o={eo:.2e} state={es:.2e}"


def test_chunk_forced_on_k_ne_v_is_value_error():
    x, _ = make_inputs(1, 64, 2, K=64, V=128, device="cuda")
    with pytest.raises(ValueError, match="route 'chunk' is not eligible: needs K == V"):
        prefill(**x, route="chunk")


def test_auto_takes_chunk_for_long_sequences_and_matches_reference():
    x, s0 = make_inputs(2, 200, 8, device="cuda", state_n=2, seed=5)
    o_auto, s_auto = _check(x, s0, route="auto")
    o_chunk, s_chunk = prefill(**x, initial_state=s0, output_final_state=True, route="chunk")
    assert torch.equal(o_auto, o_chunk) and torch.equal(s_auto, s_chunk)


def test_chunk_graph_capture_with_workspace(path):
    lengths = [300, 5, 477]
    x, s0 = make_inputs(1, sum(lengths), 4, device="cuda", state_n=3, seed=3)
    cu = cu_seqlens_of(lengths, "cuda")
    o, s = torch.empty_like(x["v"]), torch.empty(3, 4, 128, 128, device="cuda")
    ws = KdaWorkspace("cuda")
    call = dict(initial_state=s0, output_final_state=True, cu_seqlens=cu, out=(o, s), workspace=ws, route="chunk",
                tuning=path)
    prefill(**x, **call)  # sizes the workspace
    assert ws.buffer is not None and ws.buffer.numel() > 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefill(**x, **call)
    for seed in (7, 8):
        replay_equals_eager(graph, x, s0, cu, o, s, make_inputs(1, sum(lengths), 4, device="cuda", state_n=3, seed=seed),
                            route="chunk", tuning=path)


def test_capture_refuses_to_grow_the_workspace():
    x, _ = make_inputs(1, 256, 2, device="cuda", seed=4)
    ws, o = KdaWorkspace("cuda"), torch.empty_like(x["v"])
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="make one eager call with these shapes before capturing"):
        with torch.cuda.graph(graph):
            prefill(**x, workspace=ws, out=o, route="chunk")
