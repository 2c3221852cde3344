"""Host cost of kdactl.kda.prefill at B1 T64 H4 on the GPU: microseconds per call issued back to back,
then a cProfile of 2000 calls (where the host time goes). Run on a GPU node: python3 scripts/host_profile.py"""
import cProfile, pstats, time, torch
from kdactl.kda import prefill, KdaWorkspace
from kdactl.kda.inputs import random_inputs
torch.set_grad_enabled(False)
x, _, cu = random_inputs(1, 64, 4, device="cuda")
o = torch.empty_like(x["v"]); s = torch.empty(1, 4, 128, 128, device="cuda"); ws = KdaWorkspace("cuda")
f = lambda: prefill(**x, output_final_state=True, out=(o, s), workspace=ws)
for _ in range(20): f()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(1000): f()
print("us/call", (time.perf_counter() - t) * 1e3); torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): f()
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
# The floor of a replay: torch's CUDAGraph.replay of a graph holding one tiny kernel, and of ours.
def replay_us(fn, n=1000):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(20): g.replay()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): g.replay()
    us = (time.perf_counter() - t) / n * 1e6; torch.cuda.synchronize()
    return us
tiny = torch.zeros(1, device="cuda")
print("replay us/call: one tiny kernel %.2f, prefill %.2f" % (replay_us(lambda: tiny.add_(1)), replay_us(f)))
