"""Time route "chunk"'s recurrence shapes (kdactl.kda.Tuning, named: warps=4,stages=8; auto = the
launcher's choice) side by side on the serving and small-bh shapes, with kdactl bench's
timer (CUPTI kernel durations when cupti-python is installed) and its cold-L2 flush; median of --iters.
Each variant is first held to the default variant's output."""
import argparse
import statistics

import torch

from kdactl.bench.timing import L2Flusher, make_timer
from kdactl.kda import prefill
from kdactl.kda.inputs import random_inputs
from kdactl.kda.tuning import Tuning, tuning_argument
from kdactl.reference import error_ratio

SERVING = [(1, 8192, 64, None), (1, 8192, 96, None), (2, 16384, 64, None), (8, 4096, 12, None),
           (1, 8192, 96, [1300, 547, 2048, 963, 271, 3063]),
           (1, 8192, 96, [3063, 271, 963, 2048, 547, 1300])]  # fmt: skip (the same lengths reversed: longest first)
SMOKE = [(2, 1024, 16, None), (1, 1317, 4, [17, 300, 1000]), (4, 256, 8, None), (1, 2048, 32, None),
         (1, 64, 4, None)]  # certify's perf smokes and a few small serving calls
MID = [(1, 8192, 32, None), (1, 8192, 48, None), (1, 8192, 56, None), (1, 4096, 64, None), (2, 4096, 32, None),
       (1, 2048, 64, None), (1, 1024, 64, None), (1, 16384, 16, None)]  # fmt: skip (walks <= SMs)
WIDE = [(1, 8192, 80, None), (1, 4096, 96, None), (2, 8192, 64, None), (4, 4096, 32, None), (1, 8192, 128, None),
        (1, 2048, 96, None), (1, 8192, 64, None)]  # fmt: skip (walks of 4 warps > SMs >= walks of 8, and H64)
SMALL_BH = [(1, 65536, 8, None), (1, 65536, 4, None), (1, 131072, 1, None), (1, 1048576, 1, None)]

ap = argparse.ArgumentParser()
ap.add_argument("--tunings", nargs="+", type=tuning_argument, metavar="TUNING",
                default=[Tuning(), Tuning(2, 8), Tuning(4, 4), Tuning(4, 8), Tuning(8, 4)],
                help="recurrence shapes, each warps=W,stages=S (either may be left out) or auto")
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--shapes", default="all", choices=["serving", "small-bh", "smoke", "all", "ab", "wide"])
args = ap.parse_args()
SHAPES = {"serving": SERVING, "small-bh": SMALL_BH, "smoke": SMOKE, "all": SERVING + SMALL_BH[:3],
          "ab": SERVING + MID + SMOKE, "wide": SERVING[:4] + WIDE}[args.shapes]
device = torch.device("cuda", torch.cuda.current_device())
timer, timer_note = make_timer(device)
flush = L2Flusher(device, torch.cuda.get_device_properties(device).L2_cache_size)
print(f"route chunk; timer {timer.name} ({timer_note}); median ms of {args.iters}")
print("shape | " + " | ".join(str(t) for t in args.tunings))
for B, T, H, lengths in SHAPES:
    x, _, cu = random_inputs(B, T, H, lengths=lengths, device="cuda", seed=1)
    ref, _ = prefill(**x, cu_seqlens=cu, route="chunk")
    row = []
    for t in args.tunings:
        o, _ = prefill(**x, cu_seqlens=cu, route="chunk", tuning=t)  # also the warmup
        err = error_ratio(ref, o)
        times = []
        for _ in range(args.iters):
            flush()
            times.append(timer.time_ms(lambda: prefill(**x, cu_seqlens=cu, route="chunk", tuning=t)))
        row.append(f"{statistics.median(times):.3f}" + ("" if err < 1e-6 else f" (err {err:.1e})"))
    print(f"B{B}-T{T}-H{H}{'-varlen' if lengths else ''} | " + " | ".join(row), flush=True)
