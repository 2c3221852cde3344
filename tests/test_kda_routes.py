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
    long = decide_route(problem(T=8192, H=64), H200)
    assert long.route == "chunk" and long.rejected["direct"].startswith("slower than chunk")


def test_varlen_boundary_uses_mean_tokens_per_sequence():
    # 6 sequences in 8192 tokens: chunk; 1000 sequences in 8192 tokens (8 each): direct.
    assert select_route(problem(T=8192, varlen=True, N=6), H200) == "chunk"
    assert select_route(problem(T=8192, varlen=True, N=1000), H200) == "direct"


def test_chunk_needs_k_equal_v():
    p = problem(T=4096, K=64, V=128)
    d = decide_route(p, H200)
    assert d.route == "direct" and d.rejected["chunk"] == "needs K == V, got K=64 V=128"
    with pytest.raises(ValueError, match="route 'chunk' is not eligible: needs K == V"):
        select_route(p, H200, "chunk")
    assert select_route(problem(T=4096, K=64, V=64), H200) == "chunk"


def test_empty_batch_has_a_route():
    assert select_route(problem(T=0), H200) in ROUTES
