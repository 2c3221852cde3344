"""kdactl.kda.launch on the CPU with a fake kernel library: the KdaArgs a launch hands the C
launcher (the template's shapes and layout, the call's own pointers), and the layout told by the
varlen field, never by a pointer."""

import ctypes

import pytest
import torch

from kdactl.kda import launch as launch_module
from kdactl.kda.call import PrefillCall
from kdactl.kda.launch import LaunchPlan
from kdactl.kda.problem import KdaProblem
from kdactl.kda.routes import ROUTE_IDS, DeviceInfo
from kdactl.kernel_abi import KdaArgs

H200 = DeviceInfo(sm_count=132, cc=(9, 0), target="sm_90a")
LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(KdaArgs), ctypes.c_void_p)


class FakeKernels:
    """The library: records what workspace_bytes and the launcher were given."""

    target = "sm_90a"

    def __init__(self, need=0):
        self.need, self.sized, self.launched = need, [], []
        self.launcher = LAUNCHER(self._launch)

    def _launch(self, args, stream):
        a = args.contents
        self.launched.append({name: getattr(a, name) for name, _ in KdaArgs._fields_})
        return 0

    def workspace_bytes(self, route_id, args):
        self.sized.append({name: getattr(args, name) for name, _ in KdaArgs._fields_})
        return self.need

    def kda_route(self, name):
        return self.launcher

    def check(self, rc, what):
        assert rc == 0, what


@pytest.fixture
def lib(monkeypatch):
    fake = FakeKernels()
    monkeypatch.setattr(launch_module, "kernels", lambda: fake)
    monkeypatch.setattr(launch_module, "current_stream_ptr", lambda device: 0x77)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: None, raising=False)  # a CPU tensor's device index
    return fake


def problem(varlen=False, N=1):
    return KdaProblem(1, 64, 2, 128, 128, N, varlen, 0, 0)


@pytest.mark.parametrize("varlen", [False, True])
def test_the_layout_is_the_varlen_field_and_no_pointer_is_faked(lib, varlen):
    plan = LaunchPlan(problem(varlen, N=2 if varlen else 1), H200, ROUTE_IDS["chunk"], None, 0.1)
    (sized,) = lib.sized
    assert sized["varlen"] == int(varlen) and sized["cu_seqlens"] is None
    assert plan.template.varlen == int(varlen) and plan.template.cu_seqlens is None


POINTER_FIELDS = [name for name, kind in KdaArgs._fields_ if kind is ctypes.c_void_p and name != "workspace"]


def test_a_launch_passes_each_tensor_of_the_call_in_its_own_field(lib):
    plan = LaunchPlan(problem(varlen=True, N=2), H200, ROUTE_IDS["direct"], None, 0.1)
    t = {n: torch.zeros(4) for n in POINTER_FIELDS}
    assert len(t) == 13 and len({x.data_ptr() for x in t.values()}) == len(t)  # each field its own tensor
    call = PrefillCall(**{n: x for n, x in t.items() if n in PrefillCall._fields})
    plan.launch(call, t["o"], t["final_state"])
    (got,) = lib.launched
    assert {n: got[n] for n in t} == {n: x.data_ptr() for n, x in t.items()}
    assert got["varlen"] == 1 and got["heads"] == 2 and got["scale"] == pytest.approx(0.1)


def test_a_state_pool_is_the_initial_state_and_the_caller_passes_it_as_the_final_one(lib):
    plan = LaunchPlan(problem(), H200, ROUTE_IDS["direct"], None, 0.1)
    pool, x = torch.zeros(3, 2, 128, 128), torch.zeros(4)
    plan.launch(PrefillCall(x, x, x, x, x, state_pool=pool, state_indices=torch.zeros(1, dtype=torch.int32)), x, pool)
    (got,) = lib.launched
    assert got["initial_state"] == got["final_state"] == pool.data_ptr() and got["state_indices"]


class StateKernel(FakeKernels):
    """A launcher that computes on the CPU memory its pointers name, as a kernel would on the GPU:
    sequence n's final state (slot state_indices[n] of a pool, else n) is its initial state + 1,
    and every element of o is the sum of the initial states' first elements."""

    def _launch(self, args, stream):
        super()._launch(args, stream)
        a = args.contents
        size = a.heads * a.key_dim * a.value_dim
        slots = (ctypes.c_int32 * a.batch).from_address(a.state_indices) if a.state_indices else range(a.batch)
        total = 0.0
        for slot in slots:
            if slot < 0:
                continue
            start = (ctypes.c_float * size).from_address(a.initial_state + 4 * size * slot)
            end = (ctypes.c_float * size).from_address(a.final_state + 4 * size * slot)
            total += start[0]
            end[:] = [x + 1.0 for x in start]
        o = (ctypes.c_float * (a.batch * a.seqlen * a.heads * a.value_dim)).from_address(a.o)
        o[:] = [total] * len(o)
        return 0


def pool_call(monkeypatch, slow: bool):
    """A state pool call through kdactl.kda.plans.launch (initial and final state: the pool)."""
    from kdactl.kda import plans

    lib = StateKernel()
    monkeypatch.setattr(launch_module, "kernels", lambda: lib)
    monkeypatch.setattr(launch_module, "slow_fault", lambda: slow)
    p = KdaProblem(2, 8, 1, 4, 4, 2, False, 0, 0, state_pool=True)
    plan = plans.CallPlan(p, LaunchPlan(p, H200, ROUTE_IDS["direct"], None, 0.5))
    pool = torch.arange(3 * 16, dtype=torch.float32).reshape(3, 1, 4, 4)
    indices = torch.tensor([2, -1], dtype=torch.int32)
    x = torch.zeros(2, 8, 1, 4)
    call = PrefillCall(x, x, x, x, x[..., 0], state_pool=pool, state_indices=indices)
    o, state = plans.launch(plan, call, torch.zeros(2, 8, 1, 4), None)
    assert state is pool
    return o, pool, lib.launched


def test_the_slow_fault_launches_twice_with_the_results_of_one(lib, monkeypatch):
    o, pool, launched = pool_call(monkeypatch, slow=False)
    slow_o, slow_pool, slow_launched = pool_call(monkeypatch, slow=True)
    assert len(launched) == 1 and len(slow_launched) == 2
    assert torch.equal(slow_pool, pool) and torch.equal(slow_o, o)
    assert pool[2, 0, 0, 0] == 33.0 and pool[0, 0, 0, 0] == 0.0  # slot 2 once + 1; slot 0 untouched
    spare, real = slow_launched
    assert spare["initial_state"] == real["initial_state"] == real["final_state"] == slow_pool.data_ptr()
    assert spare["final_state"] != slow_pool.data_ptr() and spare["o"] != real["o"]  # the spare launch writes spares
