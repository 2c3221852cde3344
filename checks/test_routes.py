"""Route smokes: for each row of the route-boundary table (kdactl.smoke.SUITE_ROWS), the selector
picks the route the SKU matrix (fleet/skus.toml) expects for the row's shape class, and every route
in ROUTES that is eligible runs the row fixed and varlen, with and without an initial state, with a
finite output within the SPEC error ratio of the fp64 reference, once more with fla's fused
input transforms on grouped values, and once through a serving state pool (V-first, fp16 inputs,
prefix checkpoints). Routes join by being in ROUTES."""

from __future__ import annotations

import pytest

from kdactl.kda import ROUTES, select_route
from kdactl.smoke import (
    SMOKE_CONFIGS,
    SUITE_ROWS,
    ineligible_reason,
    pool_ineligible_reason,
    problem_of,
    run_pool_smoke,
    run_smoke,
)

pytestmark = pytest.mark.gpu
QUICK_ROWS = {SUITE_ROWS[0].name}


def _mark(row, *rest):
    marks = [pytest.mark.quick] if row.name in QUICK_ROWS else []
    return pytest.param(row, *rest, marks=marks, id="-".join([row.name, *map(str, rest)]))


@pytest.mark.quick
@pytest.mark.parametrize("row", SUITE_ROWS, ids=lambda r: r.name)
def test_route_selection(row, device_info, gpu_sku):
    sku, spec = gpu_sku
    if spec is None:
        pytest.skip(f"SKU {sku!r} is not in fleet/skus.toml: no expected route for {row.shape_class}")
    expected = spec.routes[row.shape_class]
    picked = select_route(problem_of(row, varlen=False), device_info)
    assert picked == expected, (
        f"selector picked {picked!r} for {row.name}, fleet/skus.toml expects {expected!r} on {sku}"
    )


@pytest.mark.parametrize(
    "row,route,layout,state",
    [_mark(row, route, layout, state) for row in SUITE_ROWS for route in ROUTES
     for layout in ("fixed", "varlen") for state in ("nostate", "state")],
)  # fmt: skip
def test_route_smoke(row, route, layout, state, device, device_info):
    varlen = layout == "varlen"
    reason = ineligible_reason(route, row, varlen, device_info)
    if reason is not None:
        pytest.skip(f"route {route} not eligible for {row.name} {layout}: {reason}")
    result = run_smoke(route, row, varlen, state == "state", device, ref_device="cuda", seed=len(row.name))
    assert result.ok, f"{row.name} {layout} {state}: {result.describe()}"


@pytest.mark.parametrize("config", SMOKE_CONFIGS)
@pytest.mark.parametrize(
    "row,route", [_mark(row, route) for row in SUITE_ROWS for route in ROUTES],
)  # fmt: skip
def test_route_smoke_fused(row, route, config, device, device_info):
    """The serving engines' calls: q/k l2norm and beta's sigmoid in the kernel, with the softplus gate
    on grouped values (Kimi Linear) or the lower-bound gate and V-first states (FlashKDA's)."""
    reason = ineligible_reason(route, row, False, device_info)
    if reason is not None:
        pytest.skip(f"route {route} not eligible for {row.name}: {reason}")
    result = run_smoke(route, row, False, True, device, ref_device="cuda", seed=len(row.name), config=config)
    assert result.ok, f"{row.name} {config}: {result.describe()}"


SERVING_ROW = next(row for row in SUITE_ROWS if row.shape_class == "serving")


@pytest.mark.parametrize(
    "row,route", [_mark(row, route) for row in SUITE_ROWS for route in ROUTES],
)  # fmt: skip
def test_route_smoke_pool(row, route, device, device_info):
    """The serving engines' states: a V-first pool updated in place by slot, with prefix checkpoints."""
    reason = pool_ineligible_reason(route, row, device_info)
    if reason is not None:
        pytest.skip(f"route {route} not eligible for {row.name} with a state pool: {reason}")
    result = run_pool_smoke(route, row, device, ref_device="cuda", seed=len(row.name))
    assert result.ok, f"{row.name} pool: {result.describe()}"


@pytest.mark.parametrize("row,route,layout", [_mark(row, route, layout) for row in SUITE_ROWS[:1] for route in ROUTES
                                              for layout in ("fixed", "varlen")])  # fmt: skip
def test_planned_calls_equal_the_full_path(row, route, layout, device, device_info):
    """What serves a repeated call: its plan (kdactl_host, or Python's table where that module is
    unavailable: the build stage's host-module check says which) launches what the full path
    launched, bit for bit, with each call's own tensors."""
    import torch

    from kdactl.kda import plans, prefill
    from kdactl.smoke import make_inputs

    varlen = layout == "varlen"
    reason = ineligible_reason(route, row, varlen, device_info)
    if reason is not None:
        pytest.skip(f"route {route} not eligible for {row.name} {layout}: {reason}")
    plans.forget_all()
    runs = []
    for seed in (1, 2, 1):  # full path, planned on other data, planned on the first data again
        x, state, cu = make_inputs(row, varlen, True, device, seed=seed)
        host = None if cu is None else cu.cpu()
        runs.append(prefill(**x, initial_state=state, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=host,
                            route=route))  # fmt: skip
    torch.cuda.synchronize(device)
    (o1, s1), (o2, s2), (o3, s3) = runs
    assert torch.equal(o1, o3) and torch.equal(s1, s3), (
        f"planned call differs from the full path ({plans.host_status()})"
    )
    assert not torch.equal(o1, o2), "the planned call did not read its own inputs"
