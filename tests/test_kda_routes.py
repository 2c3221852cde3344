"""Route selection is a pure function of problem and device facts."""

import pytest

from kdactl.kda import ROUTES, DeviceInfo, KdaProblem, decide_route, eligibility, select_route

H200 = DeviceInfo(sm_count=132, cc=(9, 0), target="sm_90a")


def problem(B=1, T=4096, H=8, K=128, V=128, varlen=False, N=None):
    return KdaProblem(B, T, H, K, V, N if N is not None else B, varlen, False, False)


def test_routes_known():
    assert "direct" in ROUTES


@pytest.mark.parametrize("p", [problem(), problem(T=1, H=1), problem(B=1, T=5000, varlen=True, N=6), problem(K=64, V=64)])
def test_auto_picks_an_eligible_route(p):
    route = select_route(p, H200)
    assert route in ROUTES
    assert eligibility(p, H200)[route] is None


def test_forced_direct_always_allowed():
    d = decide_route(problem(), H200, "direct")
    assert d.route == "direct"
    assert all(reason for reason in d.rejected.values())


def test_unknown_route_is_value_error():
    with pytest.raises(ValueError, match="route must be 'auto' or one of"):
        select_route(problem(), H200, "fast")


def test_chunk_wins_from_the_measured_boundary():
    from kdactl.kda.routes import CHUNK_MIN_TOKENS

    assert select_route(problem(T=CHUNK_MIN_TOKENS), H200) == "chunk"
    assert select_route(problem(T=CHUNK_MIN_TOKENS - 1), H200) == "direct"
    short = decide_route(problem(T=1), H200)
    assert short.route == "direct" and short.rejected["chunk"].startswith("slower than direct")
    long = decide_route(problem(T=8192, H=96), H200)
    assert long.route == "chunk" and long.rejected["direct"].startswith("slower than chunk")


def test_varlen_boundary_uses_mean_tokens_per_sequence():
    # 6 sequences in 8192 tokens: chunk (at H64, whose 6 x 128 recurrence CTAs keep small_bh out); 1000
    # sequences in 8192 tokens (8 each): direct.
    assert select_route(problem(T=8192, H=64, varlen=True, N=6), H200) == "chunk"
    assert select_route(problem(T=8192, varlen=True, N=1000), H200) == "direct"


def test_chunk_needs_k_equal_v():
    p = problem(T=4096, K=64, V=128)
    d = decide_route(p, H200)
    assert d.route == "direct" and d.rejected["chunk"] == "needs K == V, got K=64 V=128"
    with pytest.raises(ValueError, match="route 'chunk' is not eligible: needs K == V"):
        select_route(p, H200, "chunk")
    assert select_route(problem(T=4096, H=192, K=64, V=64), H200) == "chunk"


def test_empty_batch_has_a_route():
    assert select_route(problem(T=0), H200) in ROUTES


# --- route small_bh ---------------------------------------------------------------------------------


@pytest.mark.parametrize("H,T", [(8, 65536), (4, 65536), (1, 131072), (1, 1048576)])
def test_small_bh_qualification_shapes_pick_small_bh(H, T):
    d = decide_route(problem(T=T, H=H), H200)
    assert d.route == "small_bh"
    assert d.rejected["chunk"].startswith("slower than small_bh at")


@pytest.mark.parametrize("B,T,H", [(1, 8192, 96), (2, 16384, 64), (8, 4096, 12)])
def test_serving_shapes_that_fill_the_gpu_stay_on_chunk(B, T, H):
    d = decide_route(problem(B=B, T=T, H=H), H200)
    assert d.route == "chunk"
    assert "already fills the GPU" in d.rejected["small_bh"], d.rejected["small_bh"]


def test_b1_t8192_h64_takes_small_bh_which_walks_whole_sequences_where_a_start_is_cold():
    from kdactl.kda.routes import route_detail

    p = problem(T=8192, H=64)
    d = decide_route(p, H200)
    assert d.route == "small_bh"
    assert d.rejected["chunk"] == "slower than small_bh at 2 segments per sequence <= 4, walked at once where all start warm"
    assert route_detail(p, H200, "small_bh") == (
        "2 segments of 256 chunks per sequence, 128 lanes (where one does not start warm, chunk's walks of whole "
        "sequences run instead)")  # fmt: skip


def test_small_bh_plan_fills_the_recurrence_slots_once_with_a_cta_per_segment():
    from kdactl.kda.routes import SMALL_BH_CTAS_PER_SM, small_bh_plan

    plan = small_bh_plan(problem(T=1048576, H=1), H200)
    assert plan.lanes == 2  # one sequence, one head, 128 / 64 value slices
    assert plan.segments == SMALL_BH_CTAS_PER_SM * 132 // 2 == 132
    assert plan.segment_chunks == -(-65536 // 132) and (plan.segments - 1) * plan.segment_chunks < 65536
    h8 = small_bh_plan(problem(T=65536, H=8), H200)
    assert (h8.lanes, h8.segments, h8.segment_chunks) == (16, 16, 256)
    assert h8.lanes * h8.segments <= SMALL_BH_CTAS_PER_SM * 132 < h8.lanes * (h8.segments + 1)
    # fewer SMs, fewer segments; segments never shorter than SMALL_BH_MIN_SEGMENT chunks
    assert small_bh_plan(problem(T=65536, H=8), DeviceInfo(66, (9, 0), "sm_90a")).segments == 8
    # the stitch's cost per segment caps them at sqrt(chunks / 2): 8192 chunks, 64 segments
    assert small_bh_plan(problem(T=131072, H=1), H200).segments == 64
    # the stitch's cost per segment caps them at sqrt(chunks / 2): 64 chunks, 5 segments of 13
    short = small_bh_plan(problem(T=1024, H=1), H200)
    assert (short.segments, short.segment_chunks) == (5, 13)
    tiny = small_bh_plan(problem(T=96, H=1), H200)
    assert (tiny.segments, tiny.segment_chunks) == (2, 3)


def test_route_detail_says_how_small_bh_cuts_and_nothing_for_the_others():
    from kdactl.kda.routes import route_detail

    assert route_detail(problem(T=65536, H=8), H200, "small_bh") == "16 segments of 256 chunks per sequence, 16 lanes"
    varlen = problem(B=1, T=20460, H=16, varlen=True, N=5)
    assert route_detail(varlen, H200, "small_bh") == "8 segments of 160 chunks over the batch's tokens, 32 lanes"
    assert route_detail(problem(T=65536, H=8), H200, "chunk") == route_detail(problem(), H200, "direct") == ""
    one_lane = problem(T=65536, H=1, K=64, V=64)  # one head whose 64 values one CTA walks
    assert route_detail(one_lane, H200, "small_bh").endswith(", 1 lane")


def test_small_bh_covers_every_chunk_exactly():
    from kdactl.kda.routes import small_bh_plan

    for T in (64, 65, 1000, 4096, 4097, 65536, 1048576):
        for H in (1, 2, 8, 16):
            plan = small_bh_plan(problem(T=T, H=H), H200)
            chunks = -(-T // 16)
            if plan.segments >= 2:
                assert (plan.segments - 1) * plan.segment_chunks < chunks <= plan.segments * plan.segment_chunks


@pytest.mark.parametrize("p,reason", [
    (problem(T=8192, K=64, V=128), "needs K == V, got K=64 V=128"),
    (problem(T=48, H=1), "needs 4 chunks of 16 tokens (two segments), got T=48"),
    (problem(T=8192, H=128), "N x H = 128 already fills the GPU (256 recurrence CTAs a segment for 264 slots on 132 SMs)"),
])  # fmt: skip
def test_small_bh_ineligible_reasons(p, reason):
    assert reason in eligibility(p, H200)["small_bh"]
    with pytest.raises(ValueError, match="route 'small_bh' is not eligible"):
        select_route(p, H200, "small_bh")


def test_small_bh_preferred_from_its_segment_threshold():
    from kdactl.kda.routes import SMALL_BH_MIN_SEGMENTS, small_bh_plan

    # H = 32: 64 CTAs per segment index, 264 // 64 = 4 segments: a fixed layout takes small_bh (not
    # stitched), a varlen batch chunk
    p = problem(T=8192, H=32)
    assert small_bh_plan(p, H200).segments == 4 < SMALL_BH_MIN_SEGMENTS
    assert select_route(p, H200) == "small_bh"
    d = decide_route(problem(T=8192, H=32, varlen=True, N=2), H200)
    assert d.route == "chunk" and d.rejected["small_bh"] == "slower than chunk at 4 segments over the batch < 5"
    assert select_route(p, H200, "small_bh") == "small_bh"
    # H = 24: 264 // 48 = 5 segments
    assert small_bh_plan(problem(T=8192, H=24), H200).segments == SMALL_BH_MIN_SEGMENTS
    assert select_route(problem(T=8192, H=24), H200) == "small_bh"
    # short sequences stay on chunk however many segments the plan cuts
    d = decide_route(problem(T=512, H=2), H200)
    assert d.route == "chunk" and d.rejected["small_bh"] == "slower than chunk at 512 tokens per sequence < 1024"
    assert select_route(problem(T=1024, H=2), H200) == "small_bh"
    # under one chunk per sequence the direct route stays first
    assert select_route(problem(T=15, H=1), H200) == "direct"


# --- the registry: one record per route, its id the C table's ----------------------------------


def test_route_records_are_consistent():
    from kdactl.kda.routes import ROUTE_IDS, ROUTE_TABLE

    assert [r.id for r in ROUTE_TABLE] == list(range(len(ROUTE_TABLE)))  # the C side indexes by id
    assert ROUTES == tuple(r.name for r in ROUTE_TABLE) and len(set(ROUTES)) == len(ROUTES)
    assert ROUTE_IDS == {r.name: r.id for r in ROUTE_TABLE}
    for name in ROUTES:
        d = decide_route(problem(), H200, name)
        assert d.id == ROUTE_IDS[name] and ROUTE_TABLE[d.id].name == name


def test_only_small_bh_launches_with_segments():
    from kdactl.kda.routes import ROUTE_IDS, ROUTE_TABLE, small_bh_plan

    p = problem(T=65536, H=8)
    planned = {r.name: r.segment_chunks(p, H200) for r in ROUTE_TABLE}
    assert planned == {"direct": 0, "chunk": 0, "small_bh": small_bh_plan(p, H200).segment_chunks} and planned["small_bh"] > 0
    assert ROUTE_TABLE[ROUTE_IDS["small_bh"]].segment_chunks(p, H200) == 256


def test_shared_constants_are_the_ones_routing_and_validation_use():
    from kdactl import kernel_abi
    from kdactl.kda import routes, validation

    assert kernel_abi.SHARED_CONSTANTS == {"MAX_GRID_DIM": 65535, "CHUNK": 16, "SMALL_BH_CTAS_PER_SM": 2,
                                           "SMALL_BH_MAX_UNSTITCHED": 4}  # fmt: skip
    assert validation.MAX_GRID_DIM is kernel_abi.MAX_GRID_DIM and routes.CHUNK is kernel_abi.CHUNK


def test_prefill_decides_once_and_hands_the_route_id_to_the_op(monkeypatch):
    """Eager prefill decides the route and launches it directly (no torch dispatch, no second
    decision); only a traced call goes through the custom op, which decides when it runs."""
    import torch

    import kdactl.kda as kda
    from kdactl.kda import api, custom_op, validation
    from kdactl.kda.custom_op import UNDECIDED
    from tests.kda_inputs import make_inputs

    x, _ = make_inputs(1, 16, 2)
    p = problem(T=8192, H=16)  # what the (patched) validation reports: small_bh's shape
    decisions, launched = [], []
    real_decide = api.decide_route
    monkeypatch.setattr(api, "decide_route", lambda *a: decisions.append(a) or real_decide(*a))
    monkeypatch.setattr(validation, "validate", lambda *a, **kw: p)  # CPU tensors: the rules are tested elsewhere
    monkeypatch.setattr(api, "device_info", lambda device: H200)
    monkeypatch.setattr(custom_op, "kda_prefill_", lambda *a: launched.append(a[11:15]))  # route, route_id, tuning

    class Plan:  # the eager launch: route id and tuning as prefill decided them
        @classmethod
        def of(cls, problem, device, route_id, call):
            launched.append(("direct", route_id, call.tuning))
            return cls()

        def launch(self, *a):
            pass

    monkeypatch.setattr(api, "LaunchPlan", Plan)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    kda.prefill(**x)
    assert len(decisions) == 1 and launched == [("direct", real_decide(p, H200).id, kda.Tuning())]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    kda.prefill(**x, route="chunk", tuning=kda.Tuning(warps=4, stages=8))
    assert len(decisions) == 1 and launched[-1] == ("chunk", UNDECIDED, 4, 8)


def test_a_state_pool_keeps_small_bh():
    """small_bh keeps a pool's start states apart before its passes (the last segment writes the final
    state in place while others read the start), so a pool changes nothing in its choice."""
    import dataclasses

    p = problem(T=65536, H=1)
    pooled = dataclasses.replace(p, state_pool=True)
    assert select_route(p, H200) == select_route(pooled, H200) == "small_bh"
    assert eligibility(pooled, H200)["small_bh"] is None


def test_small_bh_cuts_a_varlen_batch_by_its_tokens_where_chunk_leaves_slots_free():
    """A varlen batch is cut as one sequence of its total chunks (its lengths are on the device): the
    same segment length for every sequence, so one long sequence gets many segments and short ones
    stay whole. Auto takes it unless chunk's CTAs, one per sequence and lane, fill the slots already."""
    from kdactl.kda.routes import small_bh_plan

    mixed = problem(T=16384 + 512 + 300 + 1200 + 64, H=16, varlen=True, N=5)  # suite production's MIXED_VARLEN
    fixed_like = problem(T=mixed.seqlen, H=16)  # one sequence of the same tokens
    assert small_bh_plan(mixed, H200) == small_bh_plan(fixed_like, H200)
    assert small_bh_plan(mixed, H200).lanes == 16 * 2
    assert eligibility(mixed, H200)["small_bh"] is None
    d = decide_route(mixed, H200)
    assert d.route == "small_bh" and d.rejected["chunk"] == "slower than small_bh at 8 segments over the batch >= 5"
    serving = problem(T=1300 + 547 + 2048 + 963 + 271 + 3063, H=24, varlen=True, N=6)  # 6 x 48 CTAs > 264
    d = decide_route(serving, H200)
    assert d.route == "chunk"
    assert d.rejected["small_bh"] == "slower than chunk at 6 sequences x 48 lanes fill the 264 recurrence slots already"
    assert select_route(problem(T=serving.seqlen, H=16, varlen=True, N=6), H200) == "small_bh"  # 6 x 32 CTAs
    assert select_route(mixed, H200, "small_bh") == "small_bh"


@pytest.mark.parametrize(
    "shape,varlen,halves",
    [
        ((1, 131072, 1), None, True),  # 64 segments (the sqrt cap) x 2 lanes x 2 slots = 256 of 264
        ((1, 65536, 8), None, False),  # 16 x 16 x 2 = 512: two waves already
        ((1, 262144, 1), None, False),  # 90 segments x 2 x 2 = 360
        ((1, 131072, 2), None, False),  # 64 x 4 x 2
        ((1, 32768, 1), None, True),  # 32 x 2 x 2
        ((1, 0, 1), (131072 - 64, 64), False),  # varlen: (ceil(8194 slots / 128) + 2 = 67 units) x 2 x 2 = 268
        ((1, 0, 1), (65536 - 64, 64), True),  # 45 segments of 92 chunks: (ceil(4098 / 92) + 2 = 47) x 2 x 2
    ],
)  # fmt: skip
def test_small_bh_halves_where_the_reductions_grid_fits_one_wave(shape, varlen, halves):
    from kdactl.kda.routes import small_bh_halves

    B, T, H = shape
    if varlen:
        p = KdaProblem(1, sum(varlen), H, 128, 128, len(varlen), True, 0, 0)
    else:
        p = KdaProblem(B, T, H, 128, 128, B, False, 0, 0)
    assert small_bh_halves(p, H200) == halves
