"""Per-kernel GPU time of one route on one shape (torch.profiler over a few calls, warm L2): where a
multi-kernel route spends its time.

    python3 tools/kernel_times.py [--config plain|bound|softplus] [--gates test|init|flashkda] [--g-fp32] [--bare] ROUTE B,T,H [...]

--bare: the calls without torch.profiler (for ncu, whose replay and the profiler both want CUPTI):
    ncu --kernel-name regex:kda_chunk_prepare --launch-skip 1 --launch-count 1 python3 tools/kernel_times.py --bare ...

A recurrence shape may follow the route: chunk:warps=4,stages=8 (kdactl.kda.Tuning's text form).
--config: plain is a precomputed log decay with q and k normalized; bound and softplus are the serving
configurations (q/k l2norm, beta sigmoid and the gate in the kernel; bound with a V-first state).
--gates: the raw gate inputs, fla's test draw (g, dt_bias ~ N(0, 1): steep decays), a model at
initialization (dt_bias = softplus^-1 of dt ~ logU(1e-3, 0.1), as fla's KDA layer draws it) or
FlashKDA's tests (A_log, dt_bias ~ U(0, 1): every channel decays strongly, so small_bh's segments start warm).
The raw g is bf16, as engines and kdactl bench pass it; --g-fp32 passes it in fp32 (another
instantiation of the prepare, with times of its own). --as-plain transforms a fused configuration's
inputs on the host (kdactl.reference.fused_inputs: q, k normalized, the gate as an fp32 log decay, beta's
sigmoid) and calls the plain path on them: the same decays, so the difference is what the transforms in
the kernel cost (the plain configuration's own draw, logsigmoid(N(0, 1)), decays far less than fla's).
It names its configurations itself (not through kdactl.bench.configs): `gpu_visit.sh gate-ab` runs it
against an older kdactl too, which has only kdactl.kda's names.

--case: more configurations in the same process, each in the first one's syntax, so that torch's start,
the library's load and the profiler's are paid once (28 runs of one shape each took 377 s on an H100, for
kernels that run for milliseconds). --brief: one line a shape, each kernel's microseconds a call in
launch order and their sum (kReduce and kReplay told apart):

    python3 tools/kernel_times.py --brief --config softplus --gates test small_bh 1,32768,8 \
        --case "--config bound --gates flashkda small_bh 1,8192,64" --case "chunk 1,8192,64"
"""

import argparse
import re
import shlex

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import kdactl
from kdactl.kda import prefill
from kdactl.kda.fused import BETA_SIGMOID, GATE_LOWER_BOUND, GATE_SOFTPLUS, Fused
from kdactl.kda.inputs import random_inputs
from kdactl.kda.tuning import tuning_argument
from kdactl.reference import fused_inputs

CONFIGS = {"plain": None, "bound": Fused(True, BETA_SIGMOID, GATE_LOWER_BOUND, -5.0),
           "softplus": Fused(True, BETA_SIGMOID, GATE_SOFTPLUS)}  # fmt: skip


def call_args(B, T, H, config, gates, g_fp32=False, as_plain=False):
    x, _, _ = random_inputs(B, T, H, device="cuda", seed=1)
    fused = CONFIGS[config]
    if fused is None:
        if as_plain:
            raise SystemExit("--as-plain takes a fused configuration (--config bound or softplus), not plain")
        return x, {}
    gen = torch.Generator(device="cuda").manual_seed(2)
    K = x["q"].shape[-1]
    x["q"], x["k"] = (t * 3 for t in (x["q"], x["k"]))  # not normalized: the kernel does it
    x["g"] = torch.randn(x["g"].shape, device="cuda", generator=gen).to(torch.float32 if g_fp32 else torch.bfloat16)
    x["beta"] = torch.randn(x["beta"].shape, device="cuda", generator=gen).to(x["beta"].dtype)
    A_log = torch.empty(H, device="cuda").uniform_(1, 16, generator=gen).log()
    if gates == "flashkda":
        A_log = torch.empty(H, device="cuda").uniform_(0, 1, generator=gen)
        dt_bias = torch.empty(H * K, device="cuda").uniform_(0, 1, generator=gen)
    elif gates == "test":
        dt_bias = torch.randn(H * K, device="cuda", generator=gen)
    else:
        dt = torch.empty(H * K, device="cuda").uniform_(0, 1, generator=gen) * (torch.log(torch.tensor(0.1)) - torch.log(
            torch.tensor(1e-3))) + torch.log(torch.tensor(1e-3))  # fmt: skip
        dt = dt.exp()
        dt_bias = dt + torch.log(-torch.expm1(-dt))
    layout = {"state_v_first": True} if config == "bound" else {}
    if as_plain:  # the same decays, transformed here: what the plain path costs on them
        q, k, g, beta = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], fused, A_log, dt_bias)
        x.update(q=q.to(x["q"].dtype), k=k.to(x["k"].dtype), g=g.float(), beta=beta.to(x["beta"].dtype))
        return x, layout
    return x, {"fused": fused, "A_log": A_log, "dt_bias": dt_bias, **layout}


CALLS = 3  # profiled calls a shape, after one that builds and warms
PASSES = {"0": "whole", "1": "reduce", "2": "replay"}  # chunk::Pass, as a demangled name spells it


def kernel_label(name):
    """A kernel's short label from its demangled name: kda_chunk_prepare<...> -> chunk_prepare,
    kda_chunk_recur<..., (kdactl::chunk::Pass)1, ...> -> chunk_recur.reduce."""
    base = re.search(r"kda_([a-z0-9_]+)", name)
    label = base.group(1) if base else name[:40]
    pass_ = re.search(r"Pass\)\s*(\d)|Pass::k(\w+)", name)
    if pass_:
        label += "." + (PASSES.get(pass_.group(1), pass_.group(1)) if pass_.group(1) else pass_.group(2).lower())
    return label


def brief_line(title, kernels):
    """One shape's line: `kernels` is [(label, microseconds a call)] in launch order."""
    parts = "; ".join(f"{label} {us:.1f}" for label, us in kernels)
    return f"{title}: {parts}; total {sum(us for _, us in kernels):.1f} us"


def launched_kernels(prof):
    """The profiled kda kernels as [(label, microseconds a call)], in the order of their first launch."""
    first = {}
    for evt in prof.events():  # kernels only: the eager call's op (kdactl::kda_prefill_) has their time too
        if evt.device_type == DeviceType.CUDA and "kda_" in evt.name and evt.name not in first:
            first[evt.name] = evt.time_range.start
    totals = {avg.key: avg.device_time_total for avg in prof.key_averages() if avg.key in first}
    return [(kernel_label(name), totals[name] / CALLS) for name in sorted(totals, key=first.get)]


def case_parser():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--config", default="plain", choices=list(CONFIGS))
    ap.add_argument("--gates", default="test", choices=["test", "init", "flashkda"])
    ap.add_argument("--g-fp32", action="store_true", help="the raw g in fp32 (default bf16, as engines pass it)")
    ap.add_argument("--as-plain", action="store_true",
                    help="a fused configuration's inputs transformed on the host (q, k normalized, the gate as an "
                         "fp32 log decay, beta's sigmoid) and passed to the plain path: the same decays, no transform "
                         "in the kernel")  # fmt: skip
    ap.add_argument("route")
    ap.add_argument("shapes", nargs="+")
    return ap


def time_case(args, bare, brief):
    route, _, tuning = args.route.partition(":")
    tuning = tuning_argument(tuning or "auto")
    for spec in args.shapes:
        B, T, H = map(int, spec.split(","))
        x, extra = call_args(B, T, H, args.config, args.gates, args.g_fp32, args.as_plain)
        prefill(**x, **extra, route=route, tuning=tuning)
        torch.cuda.synchronize()
        if bare:
            for _ in range(CALLS):
                prefill(**x, **extra, route=route, tuning=tuning)
            torch.cuda.synchronize()
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                prefill(**x, **extra, route=route, tuning=tuning)
            torch.cuda.synchronize()
        config = f"{args.config}{' as plain' if args.as_plain else ''}"
        title = f"{route} tuning {tuning} {config} gates={args.gates}{' g=fp32' if args.g_fp32 else ''} B{B} T{T} H{H}"
        if brief:
            print(brief_line(title, launched_kernels(prof)), flush=True)
            continue
        print(f"== {title} ({CALLS} calls, {kdactl.__file__})")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70))


def main():
    ap = argparse.ArgumentParser(parents=[case_parser()])
    ap.add_argument("--bare", action="store_true", help="the calls alone, without the profiler (for ncu)")
    ap.add_argument("--brief", action="store_true", help="one line a shape: each kernel's microseconds a call")
    ap.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="ARGS",
        help="another configuration in the first one's syntax, timed in this process after it",
    )
    args = ap.parse_args()
    cases = [args] + [case_parser().parse_args(shlex.split(case)) for case in args.case]
    for case in cases:
        time_case(case, args.bare, args.brief)


if __name__ == "__main__":
    main()
