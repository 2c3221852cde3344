"""Host cost of kdactl.kda.prefill at B1 T64 H4 on the GPU, issued back to back: the whole call, then
its parts (the launch plan's launch; the bare ctypes call into the C launcher, which is the CUDA
runtime's launch cost), the replay floor of torch's CUDAGraph, and a cProfile of 2000 calls.
Run on a GPU node: python3 scripts/host_profile.py"""
import cProfile, ctypes, pstats, time, torch
from kdactl.kda import prefill, KdaWorkspace, plans
from kdactl.kda.inputs import random_inputs
torch.set_grad_enabled(False)
x, _, cu = random_inputs(1, 64, 4, device="cuda")
o = torch.empty_like(x["v"]); s = torch.empty(1, 4, 128, 128, device="cuda"); ws = KdaWorkspace("cuda")


def per_call_us(fn, n=1000):
    for _ in range(20): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    us = (time.perf_counter() - t) / n * 1e6; torch.cuda.synchronize()
    return us


def replay_us(fn):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return per_call_us(g.replay)


for route in ("chunk", "direct"):
    f = lambda: prefill(**x, output_final_state=True, out=(o, s), workspace=ws, route=route)
    whole = per_call_us(f)
    plan = next(p for p in plans._PLANS.values() if p.launch.what.endswith(repr(route)))
    lp = plan.launch
    launch = per_call_us(lambda: lp.launch(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, o, s, ws))
    args = type(lp.template).from_buffer_copy(lp.template)
    for name in ("q", "k", "v", "g", "beta"): setattr(args, name, x[name].data_ptr())
    args.o, args.final_state = o.data_ptr(), s.data_ptr()
    if lp.need: args.workspace, args.workspace_bytes = ws.buffer.data_ptr(), ws.buffer.numel()
    stream = torch.cuda.current_stream().cuda_stream
    ref = ctypes.byref(args)
    bare = per_call_us(lambda: lp.kernel(ref, stream))
    print(f"{route}: us/call whole prefill {whole:.1f}, LaunchPlan.launch {launch:.1f}, bare C launcher {bare:.1f}")
tiny = torch.zeros(1, device="cuda")
print("replay floor us/call: torch CUDAGraph of one tiny kernel %.2f" % replay_us(lambda: tiny.add_(1)))
f = lambda: prefill(**x, output_final_state=True, out=(o, s), workspace=ws)
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): f()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
