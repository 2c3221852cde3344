"""The Python side's host cost of a planned prefill call, on the CPU: B1 T64 H4 with given outputs,
through the Python plan table and LaunchPlan.launch to a C launcher that returns at once (a ctypes
callback), with the kernel library, the device facts and the stream replaced by fakes. It times what
this repository's code adds per call (no CUDA runtime, no kdactl_host): compare two trees with it.
Run from the repository root: python3 tools/host_time_cpu.py"""
import ctypes, sys, timeit
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.kda_inputs
import kdactl.kda as kda
from kdactl.kda import api, launch, plans, validation
from kdactl.kda.routes import DeviceInfo
from kdactl.kernel_abi import KdaArgs
from tests.kda_inputs import make_inputs

torch.set_grad_enabled(False)
LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(KdaArgs), ctypes.c_void_p)(lambda args, stream: 0)


class FakeKernels:
    target = "sm_90a"
    def workspace_bytes(self, route_id, args): return 0
    def kda_route(self, name): return LAUNCHER
    def check(self, rc, what): assert rc == 0, what


launch.kernels = lambda: FakeKernels()
launch.slow_fault = lambda: False
launch.current_stream_ptr = lambda device: 0
api.device_info = lambda device: DeviceInfo(sm_count=132, cc=(9, 0), target="sm_90a")
_validate = validation.validate
validation.validate = lambda *a, **kw: _validate(*a, **{**kw, "require_cuda": False})
torch._C._cuda_getDevice = lambda: None  # a CPU tensor's device index: the launch stays on this "device"
torch.Tensor.get_device = lambda self: 0  # a CUDA device's index, for the plan key
x, _ = make_inputs(1, 64, 4)
o, s = torch.empty_like(x["v"]), torch.empty(1, 4, 128, 128)
call = lambda: kda.prefill(**x, output_final_state=True, out=(o, s))  # noqa: E731
call(), call()
assert len(plans._PLANS) == 1, "the call was not planned"
n = 20000
print(f"planned call, Python plan table, CPU tensors: {min(timeit.repeat(call, number=n, repeat=7)) / n * 1e6:.2f} us")
