"""Does route small_bh's walk keep its pace while prepare CTAs share its SMs? tools/overlap_probe.cu's
launchers (kReduce, and the prepare, apart), built here with nvcc for sm_90a and timed alone and side by
side on two streams: the first measurement of the lead "Prepare ahead, then beside the walk"
(docs/routes/small_bh.md, open leads), which pays only if the walk keeps most of its pace there.

    python3 tools/overlap_probe.py [--iters N] [--fractions 1,0.5,0.25] B,T,H [...]

Each shape runs the lower-bound configuration at FlashKDA's draw (every segment starts warm) on small_bh's
own plan: one whole call prepares workspace A (the walk reads it); the prepare writes workspace B, whose
results nothing reads. Kernel times from torch.profiler (each launch's own start and end), warm L2, median
of --iters launches a mode, one line a mode:

  walk          kReduce alone (2 CTAs an SM at K = 128)
  prepare       the prepare alone at full occupancy (12 one-warp CTAs an SM at K = 128)
  prepare@4     the prepare alone with shared memory padded so that at most 4 CTAs share an SM: the
                prepare CTAs that fit beside the walk's two, at their pace without it
  beside F      kReduce on a high-priority stream, then the prepare over the first F of the tokens on a
                low-priority one, launched right after it: both kernels' times, how long they overlapped
                and the span of the two; `chunks/us` is the prepare's rate, comparable with prepare@4's
                where the prepare ended inside the walk (F small enough)

Nothing is checked against the reference here: the launchers are the route's kernels on the route's
arguments, and the emulator checks that (tests/test_overlap_probe.py).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

from fused_probe import Calls, compile_command  # this directory: how a probe is built and planned

SOURCE = Path(__file__).with_name("overlap_probe.cu")
WALK, PREPARE = "kda_chunk_recur", "kda_chunk_prepare"  # the kernels' names, as the profiler spells them
BESIDE_CAP = 4  # prepare CTAs an SM beside kReduce's two (the lead's count; prepare@4 pads to it)


def build(out_dir: Path) -> ctypes.CDLL:
    """The probe's library (compile_command with this source)."""
    import subprocess

    from kdactl.kernel_abi import KdaArgs

    so = out_dir / "libkdactl_overlap_probe.so"
    done = subprocess.run(compile_command(so, source=SOURCE), capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"nvcc failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lib = ctypes.CDLL(str(so))
    for name in ("kdactl_overlap_walk", "kdactl_overlap_prepare"):
        getattr(lib, name).argtypes = (ctypes.POINTER(KdaArgs), ctypes.c_void_p)
        getattr(lib, name).restype = ctypes.c_int
    lib.kdactl_overlap_all_warm_at.argtypes = (ctypes.POINTER(KdaArgs),)
    lib.kdactl_overlap_all_warm_at.restype = ctypes.c_int64
    lib.kdactl_overlap_prepare_smem.argtypes = (ctypes.c_int,)
    return lib


def capped_smem(smem_per_sm: int, ctas: int) -> int:
    """Dynamic shared memory a CTA that lets at most ``ctas`` of them share an SM of ``smem_per_sm``
    bytes (the hardware reserves 1 KB a CTA)."""
    return smem_per_sm // ctas - 1024


def cut_seqlen(seqlen: int, fraction: float) -> int:
    """The first ``fraction`` of a sequence, in whole chunks of 16 tokens (at least one)."""
    return max(16, int(seqlen * fraction) // 16 * 16)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch as the profiler saw it: its name and device start and end (us)."""

    name: str
    start: float
    end: float

    @property
    def us(self) -> float:
        return self.end - self.start


def overlap(a: Launch, b: Launch) -> float:
    """How long two launches ran at the same time (us)."""
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def pairs(launches: list[Launch]) -> list[tuple[Launch, Launch]]:
    """The i-th walk with the i-th prepare, in start order (one pair an iteration of `beside`)."""
    walks = sorted((x for x in launches if WALK in x.name), key=lambda x: x.start)
    preps = sorted((x for x in launches if PREPARE in x.name), key=lambda x: x.start)
    if len(walks) != len(preps):
        raise ValueError(f"{len(walks)} walks but {len(preps)} prepares: not one of each an iteration")
    return list(zip(walks, preps, strict=True))


def alone(launches: list[Launch], kernel: str) -> str:
    """A mode's line part for one kernel run alone: its median us."""
    times = [x.us for x in launches if kernel in x.name]
    if not times:
        raise ValueError(f"no {kernel} launch was recorded")
    return f"{statistics.median(times):.1f} us"


def beside(launches: list[Launch], chunks: int) -> str:
    """`beside`'s line part: medians of the walk's and the prepare's us, their overlap, the span of
    both, how late the prepare started after the walk, and the prepare's rate over its ``chunks``."""
    rows = pairs(launches)
    med = lambda f: statistics.median(f(w, p) for w, p in rows)  # noqa: E731
    prep = med(lambda w, p: p.us)
    return (f"walk {med(lambda w, p: w.us):.1f} us, prepare {prep:.1f} us ({chunks / prep:.1f} chunks/us), "
            f"overlap {med(overlap):.1f} us, span {med(lambda w, p: max(w.end, p.end) - min(w.start, p.start)):.1f} "
            f"us, prepare started {med(lambda w, p: p.start - w.start):+.1f} us after the walk")  # fmt: skip


def profiled(run, iters: int) -> list[Launch]:
    """The kda kernels that ``iters`` calls of ``run`` launched (one device sync after each)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
            torch.cuda.synchronize()
    return [Launch(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == DeviceType.CUDA and "kda_" in e.name]  # fmt: skip


def measure(lib: ctypes.CDLL, text: str, iters: int, fractions: list[float]) -> None:
    """Print one shape's modes (the module's docstring)."""
    import torch

    from kdactl.bench.candidates import make_inputs
    from kdactl.bench.suites import parse_shape

    device = torch.device("cuda", 0)
    shape = dataclasses.replace(parse_shape(text), config="lower-bound", gate_params="flashkda")
    x = make_inputs(shape, device)
    calls = Calls(x, device, route_plan=True)
    out = calls.outputs()
    _, call, full = calls.plan(out, None)
    ws_a = torch.empty(full.need, dtype=torch.uint8, device=device)
    ws_b = torch.empty(full.need, dtype=torch.uint8, device=device)
    call_a, call_b = call._replace(workspace=ws_a), call._replace(workspace=ws_b)
    full.launch(call_a, *out)  # the route whole: workspace A's blocks, bounds and all_warm answer
    torch.cuda.synchronize()
    at = lib.kdactl_overlap_all_warm_at(ctypes.byref(full.template))
    title = f"{shape.label} ({calls.seg} chunks a segment)"
    if at < 0:  # no answer on the device: kReduce's M slots return where a segment starts warm
        title = f"{shape.label} ({calls.seg} chunks a segment, kReduce with M slots: warm starts not read back)"
    elif not ws_a[at : at + 4].any():
        print(f"{title}: not measured, a segment does not start warm (the route walks whole sequences)", flush=True)
        return

    def launcher(kernel, seqlen=None):
        _, _, lp = calls.plan(out, None)
        lp.kernel, lp.slow, lp.what = kernel, False, "the overlap probe"
        if seqlen is not None:
            lp.template.seqlen = seqlen
        return lp

    walk, prep = launcher(lib.kdactl_overlap_walk), launcher(lib.kdactl_overlap_prepare)
    hi, lo = torch.cuda.Stream(device, priority=-100), torch.cuda.Stream(device, priority=0)
    smem4 = capped_smem(torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor, BESIDE_CAP)

    def run_walk():
        walk.launch(call_a, *out, stream=hi.cuda_stream)

    def run_prepare(lp=prep):
        lp.launch(call_b, *out, stream=lo.cuda_stream)

    def run_capped():
        lib.kdactl_overlap_prepare_smem(smem4)
        run_prepare()
        lib.kdactl_overlap_prepare_smem(0)

    for run in (run_walk, run_prepare, run_capped):  # warm: the shared-memory attributes, the caches
        run()
    torch.cuda.synchronize()
    print(f"{title} walk: {alone(profiled(run_walk, iters), WALK)}", flush=True)
    print(f"{title} prepare: {alone(profiled(run_prepare, iters), PREPARE)}", flush=True)
    print(f"{title} prepare@{BESIDE_CAP}: {alone(profiled(run_capped, iters), PREPARE)}", flush=True)
    for fraction in fractions:
        seqlen = cut_seqlen(shape.seqlen, fraction)
        part = launcher(lib.kdactl_overlap_prepare, seqlen)
        chunks = shape.batch * shape.heads * (seqlen // 16)

        def both(part=part):
            run_walk()
            run_prepare(part)

        print(f"{title} beside {fraction:g}: {beside(profiled(both, iters), chunks)}", flush=True)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+", metavar="B,T,H")
    ap.add_argument("--iters", type=int, default=10, help="launches a mode (median)")
    ap.add_argument("--fractions", default="1,0.5,0.25",
                    help="the parts of the tokens the prepare beside the walk covers")  # fmt: skip
    args = ap.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    if any(not 0 < f <= 1 for f in fractions):
        raise SystemExit(f"--fractions are in (0, 1], got {args.fractions!r}")
    import torch

    torch.set_grad_enabled(False)
    lib = build(Path(tempfile.mkdtemp(prefix="kdactl_overlap_probe_")))
    for text in args.shapes:
        measure(lib, text, args.iters, fractions)


if __name__ == "__main__":
    main(sys.argv[1:])
