"""One KDA call through csrc's kernels on the CPU emulator (tests/emu), against the fp64 reference:
the quick check of a kernel change on a machine without a GPU. Builds the emulated library of this
tree's csrc (cached under --cache by content), runs each route asked for, and prints the error
ratios of o and the final state (the SPEC's limit is 5e-3), small_bh's segment plan, and whether the
outputs keep their bits when the threads between barriers run in reverse and shuffled order, and with
each warp running ahead alone.

    python3 tools/emulate.py 1,1000,2                                   # plain, chunk
    python3 tools/emulate.py --routes chunk,small_bh --sms 16 --config lower-bound --gate-params flashkda 1,1000,2
    python3 tools/emulate.py --config softplus --gate-params test --fp16 --schedules 1,1000,2
    python3 tools/emulate.py --fla-gate-case   # fla's fp16 softplus GVA draw (B3 T1000, 2 q/k heads for 8)

Shapes are B,T,H (K = V = --dim). Needs nvcc (for the toolkit's headers) and a host C++ compiler.
"""

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdactl.assets import csrc_dir  # noqa: E402
from kdactl.bench.configs import CONFIGS  # noqa: E402
from kdactl.kda.inputs import random_inputs  # noqa: E402
from kdactl.kda.problem import KdaProblem  # noqa: E402
from kdactl.kda.routes import DeviceInfo, route_detail  # noqa: E402
from kdactl.reference import ERROR_LIMIT, error_ratio, fused_inputs, kda_recurrent  # noqa: E402
from tests.emu.build import build, cuda_includes  # noqa: E402
from tests.emu.kernels import EVERY_ORDER, FORWARD, EmulatedKernels  # noqa: E402
from tests.kda_inputs import fla_gate_case, raw_inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", default="1,1000,2", help="B,T,H")
    ap.add_argument("--fla-gate-case", action="store_true",
                    help="fla's test_fused_recurrent_gate_in_kernel[B3-T1000-H2-HV8-D128-float16] draw instead: "
                         "fp16 q, k, v, 2 q/k heads for 8 value heads, l2norm, the softplus gate from A_log = "
                         "log U(1, 16), scale 1, h0 ~ N(0, 1) (fla holds o to 2e-3)")  # fmt: skip
    ap.add_argument("--routes", default="chunk", help="comma-separated: direct, chunk, small_bh")
    ap.add_argument("--config", choices=list(CONFIGS), default="plain")
    ap.add_argument("--gate-params", default="init", help="the fused gates' draw: test, init or flashkda")
    ap.add_argument("--g-range", default="-1,0", help="plain: log-space g drawn uniformly in lo,hi")
    ap.add_argument("--dim", type=int, default=128, choices=[64, 128])
    ap.add_argument("--fp16", action="store_true", help="q, k, v in fp16 (fused configurations)")
    ap.add_argument("--v-first", action="store_true")
    ap.add_argument("--sms", type=int, default=132, help="the emulated device's SM count (plans small_bh)")
    ap.add_argument(
        "--schedules", action="store_true", help="also run reversed, shuffled and warps ahead; compare bits"
    )
    ap.add_argument("--cache", type=Path, default=Path("/tmp/kdactl-emu"))
    args = ap.parse_args()
    B, T, H = (int(x) for x in args.shape.split(","))
    fused = CONFIGS[args.config].fused_spec()  # the bench's configurations; plain: no transform

    t0 = time.monotonic()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("needs nvcc on PATH (for the CUDA toolkit's headers)", file=sys.stderr)
        return 2
    lib = build(csrc_dir(), cuda_includes(nvcc), args.cache)
    print(f"library {lib.name} ({time.monotonic() - t0:.1f} s)")

    scale = None
    if args.fla_gate_case:
        x, s0, fused, A_log, dt_bias, scale = fla_gate_case()
        B, T, H = x["v"].shape[:3]
        rq, rk, rg, rb = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], fused, A_log)
    elif args.config == "plain":
        lo, hi = (float(x) for x in args.g_range.split(","))
        x, s0, _ = random_inputs(B, T, H, args.dim, args.dim, with_state=True, g_range=(lo, hi))
        A_log = dt_bias = None
        rq, rk, rg, rb = x["q"], x["k"], x["g"], x["beta"]
    else:
        if B != 1:
            print("the fused configurations draw B = 1", file=sys.stderr)
            return 2
        x, A_log, dt_bias = raw_inputs(T, H, args.gate_params, K=args.dim, fp16=args.fp16)
        s0 = None
        rq, rk, rg, rb = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], fused, A_log, dt_bias)
    ref_o, ref_s = kda_recurrent(rq, rk, x["v"], rg, rb, initial_state=s0, scale=scale)
    init = s0.transpose(-1, -2).contiguous() if (s0 is not None and args.v_first) else s0
    problem = KdaProblem(B, T, H, args.dim, args.dim, B, False, 0, 0)
    device = DeviceInfo(args.sms, (9, 0), "sm_90a")
    worst = 0.0
    for route in args.routes.split(","):
        schedules = EVERY_ORDER if args.schedules else (FORWARD,)
        runs = []
        for schedule in schedules:
            t = time.monotonic()
            kernels = EmulatedKernels(lib, args.sms, schedule)
            runs.append(kernels.run(route, **x, scale=scale, fused=fused, A_log=A_log, dt_bias=dt_bias,
                                    initial_state=None if init is None else init.clone(), state_v_first=args.v_first))  # fmt: skip
            took = time.monotonic() - t
        o, s = runs[0]
        if args.v_first:
            s = s.transpose(-1, -2)
        eo, es = error_ratio(ref_o, o), error_ratio(ref_s, s)
        worst = max(worst, eo, es)
        detail = route_detail(problem, device, route)
        extra = f"  ({detail})" if detail else ""
        same = ""
        if args.schedules:
            equal = all(torch.equal(r[0], o) and torch.equal(r[1], runs[0][1]) for r in runs[1:])
            same = "  schedules: same bits" if equal else "  schedules: DIFFERENT BITS"
        print(f"{route:9s} o {eo:.3e}  state {es:.3e}  ({took:.1f} s a run){extra}{same}")
    return 0 if worst <= ERROR_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
