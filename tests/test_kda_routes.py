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
