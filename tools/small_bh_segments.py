"""Route small_bh at several segment plans side by side: the plan's own (kdactl.kda.routes.small_bh_plan)
and that plan with its one-wave CTA budget scaled by each --factor, in a serving configuration and gate
draw, with kdactl bench's timer and cold-L2 flush. Which plan a shape wants depends on whether its
segments start warm (strong decay: kReduce alone runs, one CTA per segment slot) or are stitched (weak
decay: E and M per segment, then the stitch and the replay).

    python3 tools/small_bh_segments.py --config lower-bound --gate-params flashkda --factor 1 2 4 1,8192,12 1,8192,64

--two-ctas adds the plan cut for one wave of the reduction's two CTAs per segment (kdactl's until 2026-12-05).
"""

from __future__ import annotations

import argparse
import statistics

import torch

import kdactl.kda.routes as routes
from kdactl.bench.candidates import checker, make_inputs, reference
from kdactl.bench.configs import CONFIGS, GATE_PARAMS
from kdactl.bench.suites import Shape, parse_shape
from kdactl.bench.timing import EventTimer, L2Flusher
from kdactl.kda import KdaWorkspace, plans, prefill
from kdactl.kda.device import device_info
from kdactl.kda.validation import validate

PLAN = routes.small_bh_plan


def two_ctas_plan(p, dev):
    """The plan before 2026-12-05: segments for one wave of the reduction's two CTAs (E and M) per
    segment, S / (2 lanes) + 1 of them, which half-fills the GPU where every segment starts warm."""
    lanes = PLAN(p, dev).lanes
    wanted = routes.small_bh_slots(dev) // (2 * lanes) + 1  # the device below fits this many per lane
    return PLAN(p, routes.DeviceInfo(max(1, wanted * lanes // routes.SMALL_BH_CTAS_PER_SM), dev.cc, dev.target))


def scaled_plan(factor: float):
    """small_bh_plan as if the GPU had ``factor`` times its SMs (factor x the segments, within the
    plan's own caps)."""

    def plan(p, dev):
        return PLAN(p, routes.DeviceInfo(int(dev.sm_count * factor), dev.cc, dev.target))

    return plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="lower-bound", choices=[c for c in CONFIGS if CONFIGS[c].fused])
    ap.add_argument("--gate-params", default="flashkda", choices=list(GATE_PARAMS))
    ap.add_argument("--factor", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--two-ctas", action="store_true", help="also the plan cut for the reduction's two CTAs per segment")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("shapes", nargs="+", type=parse_shape)
    args = ap.parse_args()
    device = torch.device("cuda", 0)
    flush = L2Flusher(device, torch.cuda.get_device_properties(device).L2_cache_size)
    timer = EventTimer(device)
    for base in args.shapes:
        shape = Shape(base.batch, base.seqlen, base.heads, config=args.config, gate_params=args.gate_params)
        x = make_inputs(shape, device)
        ref = reference(x)
        config = x["config"]
        problem = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, None, state_v_first=config.state_v_first)
        o, state = torch.empty_like(x["v"]), torch.empty(problem.num_seqs, problem.heads, *problem.state_shape,
                                                          dtype=torch.float32, device=device)  # fmt: skip
        cells = []
        for factor in (["two-ctas"] if args.two_ctas else []) + args.factor:
            routes.small_bh_plan = two_ctas_plan if factor == "two-ctas" else scaled_plan(factor)
            routes._decide_route.cache_clear()
            plans.forget_all()
            sp = routes.small_bh_plan(problem, device_info(0))
            ws = KdaWorkspace(device)

            def run():
                return prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], route="small_bh", output_final_state=True,
                               out=(o, state), workspace=ws, fused=config.fused_spec(), A_log=x["A_log"],
                               dt_bias=x["dt_bias"], state_v_first=config.state_v_first)  # fmt: skip

            check = checker(run, ref, config.state_v_first)()
            times = []
            for _ in range(args.iters):
                flush()
                times.append(timer.time_ms(run))
            name = factor if factor == "two-ctas" else f"x{factor:g}"
            cells.append(f"{name}: P={sp.segments} L={sp.segment_chunks} {statistics.median(times):.3f} ms (err {check.o_err:.1e}/{check.state_err:.1e})")
        routes.small_bh_plan = PLAN
        print(f"{shape.key}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
