"""Remembered call plans (kdactl.kda.plans): a repeated call skips validation and routing and
launches the plan kept for its metadata; anything metadata cannot settle (alignment, the host
copy of cu_seqlens) sends it down the full path, and so does any change of shape, dtype or option."""

import pytest
import torch

import kdactl.kda as kda
from kdactl.kda import plans
from kdactl.kda.routes import DeviceInfo
from tests.kda_inputs import cu_seqlens_of, make_inputs
from tests.kda_plan_cases import BOUNDS, CU_SEQLENS, MISSES, SEQLEN, tensors

H200 = DeviceInfo(sm_count=132, cc=(9, 0), target="sm_90a")


@pytest.fixture
def calls(monkeypatch):
    """prefill on CPU tensors: the real validation (with require_cuda off), a fake launch."""
    from kdactl.kda import api, validation

    plans.forget_all()
    seen = {"validate": 0, "plans": 0, "launches": []}
    real_validate = validation.validate

    def validate(*a, **kw):
        seen["validate"] += 1
        return real_validate(*a, **{**kw, "require_cuda": False})

    class Plan:
        def __init__(self, route_id):
            seen["plans"] += 1
            self.route_id = route_id

        @classmethod
        def of(cls, problem, device, route_id, *rest):
            return cls(route_id)

        def launch(self, call, *rest):
            seen["launches"].append((self.route_id, call.q.data_ptr()))

    monkeypatch.setattr(validation, "validate", validate)
    monkeypatch.setattr(api, "device_info", lambda device: H200)
    monkeypatch.setattr(api, "LaunchPlan", Plan)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)  # a CUDA device's index, for the key
    yield seen
    plans.forget_all()


def _aligned(x):
    return {n: t.clone() for n, t in x.items()}


def test_a_repeated_call_takes_its_plan(calls):
    x, _ = make_inputs(1, 32, 2)
    o = torch.empty_like(x["v"])
    for _ in range(3):
        assert kda.prefill(**x, out=o)[0] is o
    assert calls["validate"] == 1 and calls["plans"] == 1 and len(calls["launches"]) == 3
    y = _aligned(x)  # other tensors, same metadata: the same plan, their own pointers
    kda.prefill(**y, out=o)
    assert calls["validate"] == 1 and calls["launches"][-1][1] == y["q"].data_ptr()


@pytest.mark.parametrize("change", [
    lambda x, kw: x.update(g=x["g"].to(torch.bfloat16)),
    lambda x, kw: x.update(q=x["q"][:, :16].contiguous(), k=x["k"][:, :16].contiguous(), v=x["v"][:, :16].contiguous(),
                           g=x["g"][:, :16].contiguous(), beta=x["beta"][:, :16].contiguous()),
    lambda x, kw: kw.update(scale=0.5),
    lambda x, kw: kw.update(output_final_state=True),
    lambda x, kw: kw.update(route="direct"),
    lambda x, kw: kw.update(state_v_first=True),
])  # fmt: skip
def test_any_change_of_metadata_or_option_takes_the_full_path(calls, change):
    x, _ = make_inputs(1, 32, 2)
    kda.prefill(**x)
    kw = {}
    change(x, kw)
    kda.prefill(**x, **kw)
    assert calls["validate"] == 2


def test_a_misaligned_view_on_a_planned_call_is_refused_by_the_full_path(calls):
    x, _ = make_inputs(1, 32, 2)
    kda.prefill(**x)
    flat = torch.empty(x["q"].numel() + 8, dtype=x["q"].dtype)
    x["q"] = flat[1 : 1 + x["q"].numel()].view(x["q"].shape)  # contiguous, same strides, 2 bytes off
    with pytest.raises(ValueError, match="q must be 16-byte aligned"):
        kda.prefill(**x)
    assert calls["validate"] == 2 and len(calls["launches"]) == 1


def test_varlen_plans_check_the_host_copy_every_call(calls):
    x, _ = make_inputs(1, 24, 2)
    cu = cu_seqlens_of([10, 14])
    kda.prefill(**x, cu_seqlens=cu, cu_seqlens_cpu=[0, 10, 24])
    kda.prefill(**x, cu_seqlens=cu, cu_seqlens_cpu=[0, 14, 24])  # other lengths, same plan
    assert calls["validate"] == 1 and len(calls["launches"]) == 2
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing, got 30 then 24"):
        kda.prefill(**x, cu_seqlens=cu, cu_seqlens_cpu=[0, 30, 24])
    assert calls["validate"] == 2 and len(calls["launches"]) == 2


def test_calls_that_need_device_values_are_never_planned(calls):
    x, _ = make_inputs(1, 24, 2)
    cu = cu_seqlens_of([10, 14])
    for _ in range(2):
        kda.prefill(**x, cu_seqlens=cu)  # no host copy: the bounds are read back every call
    assert calls["validate"] == 2
    for _ in range(2):
        kda.prefill(**x, checkpoint_every=16)
    assert calls["validate"] == 4


def test_the_table_is_bounded(calls, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    x, _ = make_inputs(1, 32, 2)
    for scale in (0.1, 0.2, 0.3):
        kda.prefill(**x, scale=scale)
    assert len(plans._PLANS) == 1  # full at the third: started over



@pytest.mark.parametrize("bounds, planned", BOUNDS)
def test_the_python_table_checks_the_host_bounds_as_kdactl_host_does(bounds, planned):
    assert plans.bounds_ok(bounds, torch.tensor(CU_SEQLENS), SEQLEN) == planned


def test_prefill_describes_its_call_once_with_every_argument_by_name(monkeypatch):
    """PrefillCall names prefill's every argument (defaults too), and prefill fills each field from
    the argument of its name (it builds the tuple by position, for speed)."""
    import inspect

    from kdactl.kda import api
    from kdactl.kda.call import PrefillCall

    params = inspect.signature(kda.prefill).parameters
    assert set(params) == set(PrefillCall._fields)
    assert {n: p.default for n, p in params.items() if p.default is not p.empty} == PrefillCall._field_defaults
    seen = []
    monkeypatch.setattr(api, "_full_call", lambda call, options: seen.append((call, options)))
    given = {name: object() for name in PrefillCall._fields}  # checkpoint_every given: never planned
    kda.prefill(**given)
    ((call, options),) = seen
    assert type(call) is PrefillCall and call._asdict() == given and options is None


def test_under_the_slow_fault_the_plans_stay_in_python(monkeypatch):
    """kdactl_host launches once; the slow fault's spare launch is LaunchPlan.launch's."""

    def no_host_module(*a, **kw):
        raise AssertionError("kdactl_host must not be loaded under KDACTL_FAULT=slow")

    monkeypatch.setattr(plans, "_HOST", None)
    monkeypatch.setattr(plans, "_DECIDED", False)
    monkeypatch.setattr(plans, "_STATUS", "")
    monkeypatch.setattr(plans, "slow_fault", lambda: True)
    monkeypatch.setattr(plans, "load_host_module", no_host_module)
    monkeypatch.delenv("KDACTL_HOST_MODULE", raising=False)
    plans._choose_table()
    assert plans._HOST is None and plans.host_status() == "python: KDACTL_FAULT=slow"


@pytest.mark.parametrize("change", MISSES.values(), ids=MISSES.keys())
def test_the_python_table_misses_on_the_changes_kdactl_host_misses_on(change):
    from kdactl.kda.call import PrefillCall

    options = (None, True, "auto", kda.Tuning(), None, False, False, type(None))
    key, aligned = plans.call_key(PrefillCall(*tensors()), options)
    assert key is not None and aligned
    other, other_aligned = plans.call_key(PrefillCall(*tensors(**change)), options)
    assert other is None or other != key or not other_aligned
