"""Per-kernel GPU time of one route on one shape (torch.profiler over a few calls, warm L2): where a
multi-kernel route spends its time.   python3 scripts/kernel_times.py small_bh 1,131072,1 [...]
A tuning code may follow the route: chunk:100 (its two kernels), chunk:200 (its fused grid)."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from kdactl.kda import prefill
from kdactl.kda.inputs import random_inputs

route, _, tuning = sys.argv[1].partition(":")
tuning = int(tuning or 0)
for spec in sys.argv[2:]:
    B, T, H = map(int, spec.split(","))
    x, _, _ = random_inputs(B, T, H, device="cuda", seed=1)
    prefill(**x, route=route, tuning=tuning)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            prefill(**x, route=route, tuning=tuning)
        torch.cuda.synchronize()
    print(f"== {route} tuning {tuning} B{B} T{T} H{H} (3 calls)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70))
