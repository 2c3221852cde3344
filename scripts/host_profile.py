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
