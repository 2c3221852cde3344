"""kdactl_host (csrc/host/kdactl_host.cpp), built with the real nvcc against this torch and driven on
CPU tensors with a fake launcher: a planned call fills KdaArgs' pointers from its own tensors and
launches; every metadata or option change, misaligned pointer, bad host bound, other device, or
workspace not yet bound to this stream misses (the Python full path then decides and raises)."""

import ctypes

import pytest
import torch

from kdactl import kernel_abi
from kdactl.kda.call import PrefillCall
from kdactl.kernel_abi import KdaArgs
from kdactl.settings import Settings
from tests.kda_plan_cases import BOUNDS, CU_SEQLENS, MISSES, tensors

pytestmark = pytest.mark.nvcc

LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(KdaArgs), ctypes.c_void_p)
CAPTURE_ID = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong))
STREAM = 0x7700
OPTIONS = (None, True, "auto", 0, None, False, False, type(None))


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    from kdactl.jit.host import load_host_module

    root = tmp_path_factory.mktemp("host")
    (root / "cache").mkdir(mode=0o700)
    module, entry = load_host_module(Settings(cache_dir=root / "cache", data_dir=root / "data"), "sm_90a")
    assert entry.built
    assert not load_host_module(Settings(cache_dir=root / "cache", data_dir=root / "data"), "sm_90a")[1].built
    return module


class Fake:
    """The accessors configure takes, and a launcher that records what it was given."""

    def __init__(self, module, rc=0):
        self.device, self.capture, self.rc, self.calls = 0, 0, rc, []
        self.launcher = LAUNCHER(self._launch)
        self.capture_fn = CAPTURE_ID(self._capture)
        module.configure(lambda index: STREAM + index, lambda: self.device, self.address(self.capture_fn))

    @staticmethod
    def address(fn) -> int:
        return ctypes.cast(fn, ctypes.c_void_p).value

    def _launch(self, args, stream):
        a = args.contents
        self.calls.append(dict(q=a.q, k=a.k, v=a.v, g=a.g, beta=a.beta, initial_state=a.initial_state, o=a.o,
                               final_state=a.final_state, cu_seqlens=a.cu_seqlens, workspace=a.workspace,
                               workspace_bytes=a.workspace_bytes, heads=a.heads, stream=stream, A_log=a.A_log,
                               dt_bias=a.dt_bias, state_indices=a.state_indices, checkpoints=a.checkpoints))  # fmt: skip
        return self.rc

    def _capture(self, stream, out):
        out[0] = self.capture
        return 0


def call(t, out=None, cu_seqlens_cpu=None, workspace=None):
    """The call prefill hands the module: the tensors, then out, cu_seqlens_cpu and workspace."""
    return PrefillCall(*t, out, cu_seqlens_cpu, workspace)


def remember(module, fake, t, out=None, options=OPTIONS, need=0, state_shape=(1, 4, 128, 128), seqlen=64, plan="LP"):
    template = KdaArgs(heads=4, key_dim=128, value_dim=128)
    assert module.remember(options, call(t, out), bytes(template), fake.address(fake.launcher), need, 0, seqlen,
                           state_shape, plan)  # fmt: skip


def test_a_planned_call_launches_with_its_own_pointers_and_fresh_outputs(module):
    fake = Fake(module)
    t = tensors()
    assert module.run(OPTIONS, call(t)) is None  # nothing planned yet
    remember(module, fake, t)
    u = tensors()  # other tensors, same metadata
    o, state = module.run(OPTIONS, call(u))
    assert o.shape == u[2].shape and o.dtype == u[0].dtype and state.shape == (1, 4, 128, 128)
    assert state.dtype == torch.float32
    got = fake.calls[-1]
    assert [got[n] for n in ("q", "k", "v", "g", "beta")] == [x.data_ptr() for x in u[:5]]
    assert got["o"] == o.data_ptr() and got["final_state"] == state.data_ptr() and got["initial_state"] is None
    assert got["heads"] == 4 and got["stream"] == STREAM and module.size() == 1


@pytest.mark.parametrize("pool", [False, True])
def test_each_tensor_of_the_call_lands_in_the_field_of_its_name(module, pool):
    fake = Fake(module)
    named = {n: torch.zeros(8) for n in ("initial_state", "cu_seqlens", "A_log", "dt_bias", "state_indices")}
    named["state_pool"] = torch.zeros(8) if pool else None
    t = tensors(**named)
    o, state = torch.empty(8), torch.empty(8)
    remember(module, fake, t, out=(o, state))
    module.run(OPTIONS, call(t, (o, state)))
    got = fake.calls[-1]
    want = dict(zip(PrefillCall._fields, (x.data_ptr() if x is not None else None for x in t)))
    if pool:  # the pool is the initial and the final state
        want["initial_state"] = want["final_state"] = want.pop("state_pool")
    else:
        del want["state_pool"]
        want["final_state"] = state.data_ptr()
    want.update(o=o.data_ptr(), checkpoints=None)
    assert {n: got[n] for n in want} == want
    pointers = [v for v in want.values() if v is not None]
    assert len(set(pointers)) == len(pointers) - pool  # distinct tensors, but for the pool's two fields


def test_given_outputs_and_the_state_pool_are_returned_as_given(module):
    fake = Fake(module)
    o, s = torch.empty(1, 64, 4, 128), torch.empty(1, 4, 128, 128)
    t = tensors()
    remember(module, fake, t, out=(o, s))
    got = module.run(OPTIONS, call(t, (o, s), None, None))
    assert got[0] is o and got[1] is s and fake.calls[-1]["final_state"] == s.data_ptr()
    pool, idx = torch.zeros(3, 4, 128, 128), torch.tensor([2], dtype=torch.int32)
    options = (None, False, "auto", 0, None, False, False, type(None))
    t = tensors(state_pool=pool, state_indices=idx)
    remember(module, fake, t, options=options, state_shape=())
    got = module.run(options, call(t))
    assert got[1] is pool and fake.calls[-1]["initial_state"] == fake.calls[-1]["final_state"] == pool.data_ptr()


@pytest.mark.parametrize("change", MISSES.values(), ids=MISSES.keys())
def test_any_other_metadata_misses(module, change):
    fake = Fake(module)
    remember(module, fake, tensors())
    assert module.run(OPTIONS, call(tensors(**change))) is None and not fake.calls


def test_other_options_or_out_miss(module):
    fake = Fake(module)
    t = tensors()
    remember(module, fake, t)
    assert module.run((0.5, *OPTIONS[1:]), call(t)) is None
    assert module.run(OPTIONS, call(t, torch.empty(1, 64, 4, 128), None, None)) is None
    assert not fake.calls


def test_another_current_device_misses(module):
    fake = Fake(module)
    t = tensors()
    remember(module, fake, t)
    fake.device = 1
    assert module.run(OPTIONS, call(t)) is None and not fake.calls


@pytest.mark.parametrize("bounds, planned", BOUNDS)
def test_varlen_calls_check_the_host_bounds(module, bounds, planned):
    fake = Fake(module)
    cu = torch.tensor(CU_SEQLENS)
    options = (*OPTIONS[:-1], type(bounds))
    t = tensors(cu_seqlens=cu)
    remember(module, fake, t, options=options, state_shape=(2, 4, 128, 128))
    got = module.run(options, call(t, None, bounds, None))
    assert (got is not None) == planned and len(fake.calls) == int(planned)
    if planned:
        assert fake.calls[0]["cu_seqlens"] == cu.data_ptr() and got[1].shape == (2, 4, 128, 128)


class Workspace:
    def __init__(self, stream=None, capture_id=None, buffer=None, device=torch.device("cuda", 0)):
        self.stream, self.capture_id, self.buffer, self.device = stream, capture_id, buffer, device


@pytest.mark.parametrize("ws, capture, planned", [
    (Workspace(stream=STREAM, buffer=torch.empty(4096, dtype=torch.uint8)), 0, True),
    (Workspace(capture_id=5, buffer=torch.empty(4096, dtype=torch.uint8)), 5, True),
    (Workspace(buffer=torch.empty(4096, dtype=torch.uint8)), 0, False),  # unbound: the Python claim binds it
    (Workspace(stream=0x1234, buffer=torch.empty(4096, dtype=torch.uint8)), 0, False),  # another stream
    (Workspace(stream=STREAM, buffer=torch.empty(4096, dtype=torch.uint8)), 5, False),  # a capture to bind
    (Workspace(capture_id=5, buffer=torch.empty(4096, dtype=torch.uint8)), 0, False),  # owned by a graph
    (Workspace(capture_id=5, buffer=torch.empty(4096, dtype=torch.uint8)), 6, False),  # another capture
    (Workspace(stream=STREAM, buffer=torch.empty(100, dtype=torch.uint8)), 0, False),  # to grow
    (Workspace(stream=STREAM), 0, False),
    (Workspace(stream=STREAM, buffer=torch.empty(4096, dtype=torch.uint8), device=torch.device("cuda", 1)), 0, False),
])  # fmt: skip
def test_a_workspace_is_used_only_once_bound_to_this_stream_or_capture(module, ws, capture, planned):
    fake = Fake(module)
    fake.capture = capture
    options = (*OPTIONS[:6], True, OPTIONS[7])
    t = tensors()
    remember(module, fake, t, options=options, need=4000)
    got = module.run(options, call(t, None, None, ws))
    assert (got is not None) == planned
    if planned:
        assert fake.calls[0]["workspace"] == ws.buffer.data_ptr() and fake.calls[0]["workspace_bytes"] == 4096


def test_without_a_workspace_the_scratch_is_allocated(module):
    fake = Fake(module)
    t = tensors()
    remember(module, fake, t, need=4000)
    module.run(OPTIONS, call(t))
    assert fake.calls[0]["workspace"] and fake.calls[0]["workspace_bytes"] == 4000


def test_a_launcher_error_returns_its_code_and_the_plan(module):
    fake = Fake(module, rc=10106)
    t = tensors()
    remember(module, fake, t, plan="the launch plan")
    assert module.run(OPTIONS, call(t)) == [10106, "the launch plan"]


def test_the_table_is_bounded_and_configure_forgets(module):
    fake = Fake(module)
    t = tensors()
    for i in range(1025):
        remember(module, fake, t, options=(float(i), *OPTIONS[1:]))
    assert module.size() == 1  # full at the 1025th: started over
    Fake(module)
    assert module.size() == 0


def test_a_template_of_another_size_is_refused(module):
    fake = Fake(module)
    with pytest.raises(TypeError, match="KdaArgs bytes"):
        module.remember(OPTIONS, call(tensors()), b"\0" * 8, fake.address(fake.launcher), 0, 0, 64, (), "LP")


@pytest.mark.parametrize("slots, constants, why", [
    (tuple(reversed(kernel_abi.CALL_FIELDS)), kernel_abi.HOST_CONSTANTS,
     "call field 0 is 'q' in kdactl_host, 'workspace' in Python"),
    (kernel_abi.CALL_FIELDS[:-1], kernel_abi.HOST_CONSTANTS, "call field 13 is 'workspace' in kdactl_host, missing"),
    ((*kernel_abi.CALL_FIELDS, "checkpoints"), kernel_abi.HOST_CONSTANTS, "call field 14 is missing in kdactl_host, "
                                                                           "'checkpoints' in Python"),
    (kernel_abi.CALL_FIELDS, {**kernel_abi.HOST_CONSTANTS, "ARGS_SIZE": 8}, r"ARGS_SIZE is \d+ in kdactl_host, 8 in"),
    (kernel_abi.CALL_FIELDS, {**kernel_abi.HOST_CONSTANTS, "ABI_VERSION": 6},
     f"ABI_VERSION is {kernel_abi.ABI_VERSION} in kdactl_host, 6 in"),
    (kernel_abi.CALL_FIELDS, {"MAX_PLANS": 1024}, f"ABI_VERSION is {kernel_abi.ABI_VERSION} in kdactl_host, missing"),
])  # fmt: skip
def test_a_python_side_of_another_tensor_order_or_constants_is_refused(module, slots, constants, why):
    with pytest.raises(ValueError, match=f"kdactl_host does not match kdactl.kernel_abi: .*{why}"):
        module.check_abi(slots, constants)
    try:
        with pytest.raises(RuntimeError, match="check_abi has not passed"):
            Fake(module)  # configure refuses until the check passes
    finally:
        module.check_abi(kernel_abi.CALL_FIELDS, kernel_abi.HOST_CONSTANTS)
    Fake(module)


def test_the_module_is_built_with_the_constants_python_relies_on(module):
    assert module.check_abi(kernel_abi.CALL_FIELDS, kernel_abi.HOST_CONSTANTS) is None
    assert kernel_abi.HOST_CONSTANTS["ARGS_SIZE"] == ctypes.sizeof(KdaArgs)
