"""kdactl.smoke on the CPU: the route table's rows, their problems and inputs, and the reference it
compares with (the GPU run executes the routes)."""

from __future__ import annotations

import torch

from kdactl.kda import ROUTES, DeviceInfo, validate
from kdactl.reference import error_ratio, kda_recurrent
from kdactl.skus import SHAPE_CLASSES
from kdactl.smoke import PAYLOAD_ROWS, SUITE_ROWS, SmokeResult, ineligible_reason, make_inputs, problem_of

H200 = DeviceInfo(sm_count=132, cc=(9, 0), target="sm_90a")


def test_rows_cover_every_shape_class_and_name_their_shape():
    assert {r.shape_class for r in SUITE_ROWS} == set(SHAPE_CLASSES)
    assert SUITE_ROWS[0].name == "decode_like-B4-T8-H8"
    assert all(len(r.lengths) >= 1 for r in (*SUITE_ROWS, *PAYLOAD_ROWS))


def test_inputs_validate_and_match_the_problem():
    for row in (*SUITE_ROWS[:2], *PAYLOAD_ROWS):
        for varlen in (False, True):
            x, s0, cu = make_inputs(row, varlen, True, torch.device("cpu"))
            problem = validate(**x, scale=None, initial_state=s0, cu_seqlens=cu, require_cuda=False)
            assert problem == problem_of(row, varlen)


def test_direct_is_eligible_everywhere_and_unknown_routes_say_so():
    for row in SUITE_ROWS:
        for varlen in (False, True):
            assert ineligible_reason("direct", row, varlen, H200) is None
    assert "not in ROUTES" in ineligible_reason("nosuch", SUITE_ROWS[0], False, H200)
    assert "direct" in ROUTES


def test_reference_agrees_with_itself_and_result_verdict():
    x, s0, cu = make_inputs(PAYLOAD_ROWS[0], True, True, torch.device("cpu"))
    o, s = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu)
    assert error_ratio(o, o) == 0.0 and torch.isfinite(s).all()
    assert SmokeResult("direct", 1e-3, 4e-3).ok and not SmokeResult("direct", 6e-3, 0.0).ok
    assert "OUTSIDE" in SmokeResult("direct", float("inf"), 0.0).describe()


def test_smokes_make_both_serving_calls_as_the_engines_do():
    """The softplus call on grouped values with K-first states, the lower-bound call on full q/k heads
    with V-first states: the inputs each would hand prefill, valid for it."""
    from kdactl.bench.configs import CONFIGS
    from kdactl.smoke import SMOKE_CONFIGS, fused_variant

    assert set(SMOKE_CONFIGS) == {"softplus", "lower-bound"} and all(CONFIGS[c].fused for c in SMOKE_CONFIGS)
    row = SUITE_ROWS[0]  # H = 8
    x, s0, cu = make_inputs(row, False, True, torch.device("cpu"))
    for name, q_heads, v_first in (("softplus", row.heads // 2, False), ("lower-bound", row.heads, True)):
        raw, state, A_log, dt_bias = fused_variant(x, s0, CONFIGS[name], seed=1)
        assert raw["q"].shape[2] == raw["k"].shape[2] == q_heads, name
        assert torch.equal(state, s0.transpose(-1, -2) if v_first else s0), name
        assert A_log.shape == (row.heads,) and dt_bias.shape == (row.heads * x["q"].shape[-1],)
        validate(**raw, scale=None, initial_state=state, cu_seqlens=cu, require_cuda=False, state_v_first=v_first)
