"""Host cost of kdactl.kda.prefill at B1 T64 H4 on the GPU, issued back to back: the whole call with
its plans in kdactl_host and in Python, its parts (the launch plan's launch; the bare ctypes call
into the C launcher, which is the CUDA runtime's launch cost), graph replay through torch and
through a bare cudaGraphLaunch of the same graph, the replay floor of a one-kernel graph, and a
cProfile of 2000 calls. Run on a GPU node: python3 tools/host_profile.py"""
import cProfile, ctypes, glob, os, pstats, time, torch
from kdactl.bench import host as bench_host
from kdactl.kda import prefill, KdaWorkspace, plans
from kdactl.kda.call import PrefillCall
from kdactl.kda.inputs import random_inputs
torch.set_grad_enabled(False)
x, _, cu = random_inputs(1, 64, 4, device="cuda")
o = torch.empty_like(x["v"]); s = torch.empty(1, 4, 128, 128, device="cuda")


def per_call_us(fn):  # kdactl bench --host's count (200 calls, median of 7), after 20 warmup calls
    for _ in range(20): fn()
    return bench_host.per_call_us(fn, torch.cuda.synchronize, time.perf_counter)


def cudart():
    import nvidia.cu13 as cu  # the CUDA runtime torch ships (a namespace package: no __file__)
    found = [p for root in cu.__path__ for p in glob.glob(os.path.join(root, "lib", "libcudart.so*"))]
    path = found[0] if found else "libcudart.so.13"  # else the one torch already loaded, by soname
    lib = ctypes.CDLL(path)
    lib.cudaGraphLaunch.argtypes, lib.cudaGraphLaunch.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    return lib


def replays(fn):
    """(torch CUDAGraph.replay, bare cudaGraphLaunch of the same graph) us per replay."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    try:
        lib, exec_, stream = cudart(), g.raw_cuda_graph_exec(), torch.cuda.current_stream().cuda_stream
        bare = per_call_us(lambda: lib.cudaGraphLaunch(exec_, stream))
    except Exception as err:  # noqa: BLE001
        print("no bare cudaGraphLaunch:", err); bare = float("nan")
    return per_call_us(g.replay), bare


for route in ("chunk", "direct"):
    ws = KdaWorkspace("cuda")
    f = lambda: prefill(**x, output_final_state=True, out=(o, s), workspace=ws, route=route)
    f()
    print(f"plans kept by: {plans.host_status()}")
    native = per_call_us(f)
    host, plans._HOST = plans._HOST, None  # the same calls with the plans in Python
    python = per_call_us(f)
    plan = next(p for p in plans._PLANS.values() if p.launch.what.endswith(repr(route)))
    plans._HOST = host
    lp = plan.launch
    call = PrefillCall(**x, workspace=ws)
    launch = per_call_us(lambda: lp.launch(call, o, s))
    args = type(lp.template).from_buffer_copy(lp.template)
    for name in ("q", "k", "v", "g", "beta"): setattr(args, name, x[name].data_ptr())
    args.o, args.final_state = o.data_ptr(), s.data_ptr()
    if lp.need: args.workspace, args.workspace_bytes = ws.buffer.data_ptr(), ws.buffer.numel()
    stream = torch.cuda.current_stream().cuda_stream
    ref = ctypes.byref(args)
    bare = per_call_us(lambda: lp.kernel(ref, stream))
    torch_replay, bare_replay = replays(f)  # the graph owns ws from here on
    print(f"{route}: us/call whole prefill {native:.1f} (plans in Python: {python:.1f}), LaunchPlan.launch {launch:.1f}, "
          f"bare C launcher {bare:.1f}; replay: torch {torch_replay:.2f}, bare cudaGraphLaunch {bare_replay:.2f}")
tiny = torch.zeros(1, device="cuda")
print("replay floor us/call, a graph of one tiny kernel: torch %.2f, bare cudaGraphLaunch %.2f" % replays(lambda: tiny.add_(1)))
ws = KdaWorkspace("cuda")
f = lambda: prefill(**x, output_final_state=True, out=(o, s), workspace=ws)
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): f()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
