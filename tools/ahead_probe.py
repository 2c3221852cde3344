"""``kdactl bench`` with route small_bh's prepare split ahead of and beside its walk (tools/ahead_probe.cu, the
lead "Prepare ahead, then beside the walk" of docs/routes/small_bh.md): a measurement of that design, not a
route. Built here with nvcc for sm_90a, then checked and timed beside the candidates the command line asks
for, in the same run, by the same harness (fp64 reference first, cold L2, ABBA, the chosen timer):

    AHEAD_PROBE_FRACTIONS="0.45 0.55 0.65" python3 tools/ahead_probe.py --suite production \\
        --config lower-bound --gate-params flashkda --routes auto --peers cudnn --iters 3 --warmup 1

Every argument is kdactl bench's. Candidates join each fixed-length shape (K = V = 128, bf16 q, k, v, g):
  small_bh@S  route small_bh on its own plan (S chunks a segment), whose bits each probe must equal;
  ahead@F     the probe with the first F of every segment's chunks prepared ahead (at most S - 8: the last 8
              of each segment are prepared ahead too), the rest by each CTA's prepare warps beside its walk.
A shape where a segment does not start warm within 8 chunks is reported as not run, with why.

``--raw B,T,H ...`` prints instead each kernel's time (torch.profiler, warm L2, median of AHEAD_PROBE_ITERS
calls) of small_bh and of each fraction's probe, lower-bound configuration at FlashKDA's draw, unchecked.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fused_probe import Calls, Probe, checked_candidates, compile_command, unsupported  # this directory

SOURCE = Path(__file__).with_name("ahead_probe.cu")
TAIL = 8  # a segment's last chunks, always prepared ahead (ahead_probe.cu's kTail)
FRACTIONS = "0.45 0.55 0.65"


def build(out_dir: Path) -> ctypes.CDLL:
    """The probe's library; ptxas' register and spill lines for its kernels go to stderr."""
    from kdactl.kernel_abi import KdaArgs

    so = out_dir / "libkdactl_ahead_probe.so"
    done = subprocess.run(compile_command(so, source=SOURCE), capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"nvcc failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = done.stderr.splitlines()
    for i, line in enumerate(lines):
        if "Function properties for" in line and "kda_ahead" in line:
            print("ahead_probe ptxas:", " | ".join(x.strip() for x in lines[i : i + 3]), file=sys.stderr)
    lib = ctypes.CDLL(str(so))
    lib.kdactl_ahead_probe.argtypes = (ctypes.POINTER(KdaArgs), ctypes.c_void_p)
    lib.kdactl_ahead_probe.restype = ctypes.c_int
    lib.kdactl_ahead_probe_chunks.argtypes = (ctypes.c_int,)
    return lib


def ahead_chunks(segment_chunks: int, fraction: float) -> int:
    """Chunks at the start of each segment prepared ahead: ``fraction`` of it, within what the probe takes."""
    return max(0, min(segment_chunks - TAIL, round(fraction * segment_chunks)))


def probe(calls: Calls, lib: ctypes.CDLL, ahead: int) -> Probe:
    """The probe on ``calls``' shape at small_bh's own segments, ``ahead`` chunks of each prepared ahead, into
    outputs and a small_bh workspace of its own (whose last word says whether a segment started cold)."""
    import torch

    out = calls.outputs()
    _, call, lp = calls.plan(out, None)
    workspace = torch.empty(lp.need, dtype=torch.uint8, device=calls.device)
    call = call._replace(workspace=workspace)
    lp.kernel, lp.slow, lp.what = lib.kdactl_ahead_probe, False, "the ahead probe"

    def run():
        lib.kdactl_ahead_probe_chunks(ahead)
        lp.launch(call, *out)
        return out

    def refused() -> str | None:
        if workspace[-4:].any():
            return f"a segment does not start warm within {TAIL} chunks (the probe does not stitch)"
        return None

    return Probe(run, out, refused, f"{ahead} of {calls.seg} chunks a segment prepared ahead")


def candidates(x, ref, device, lib: ctypes.CDLL, fractions: list[float]):
    """small_bh on its plan and the probe at each fraction, for one shape (fused_probe.checked_candidates)."""
    from kdactl.bench.model import Candidate

    names = [f"ahead@{f:g}" for f in fractions]
    why = unsupported(x)
    calls = None if why else Calls(x, device, route_plan=True)
    if calls is not None and calls.seg <= TAIL:
        why = f"small_bh's plan cuts segments of {calls.seg} chunks; the probe needs more than {TAIL}"
    if why:
        return [Candidate(name, "route", reason=why) for name in names]
    probes = {name: probe(calls, lib, ahead_chunks(calls.seg, f)) for name, f in zip(names, fractions, strict=True)}
    return checked_candidates(x, ref, calls, probes)


def raw_times(shapes: list[str], lib: ctypes.CDLL, fractions: list[float], iters: int) -> None:
    """Each kernel's median us a call of small_bh and of the probe at each fraction, per shape."""
    import torch
    from kernel_times import kernel_label
    from overlap_probe import profiled

    from kdactl.bench.candidates import make_inputs
    from kdactl.bench.suites import parse_shape

    device = torch.device("cuda", 0)
    for text in shapes:
        shape = dataclasses.replace(parse_shape(text), config="lower-bound", gate_params="flashkda")
        calls = Calls(make_inputs(shape, device), device, route_plan=True)
        runs = {f"small_bh@{calls.seg}": calls.twin()[0]}
        for f in fractions:
            p = probe(calls, lib, ahead_chunks(calls.seg, f))
            p.run()
            torch.cuda.synchronize(device)
            why = p.refused()
            runs[f"ahead@{f:g}" + (f" ({why})" if why else "")] = p.run
        for name, run in runs.items():
            run()
            launches = profiled(run, iters)
            kernels = {}
            for x in launches:
                kernels.setdefault(kernel_label(x.name), []).append(x.us)  # launch order: dicts keep it
            parts = "; ".join(f"{k} {statistics.median(v):.1f}" for k, v in kernels.items())
            total = sum(statistics.median(v) for v in kernels.values())
            print(f"{shape.label} {name}: {parts}; total {total:.1f} us", flush=True)


def main(argv: list[str]) -> None:
    import kdactl.bench.runner as runner
    from kdactl.bench.harness import TorchHarness
    from kdactl.cli import app

    fractions = [float(f) for f in os.environ.get("AHEAD_PROBE_FRACTIONS", FRACTIONS).split()]
    if any(not 0 <= f <= 1 for f in fractions):
        raise SystemExit(f"AHEAD_PROBE_FRACTIONS are in [0, 1], got {fractions}")
    lib = build(Path(tempfile.mkdtemp(prefix="kdactl_ahead_probe_")))
    if argv[:1] == ["--raw"]:
        raw_times(argv[1:], lib, fractions, int(os.environ.get("AHEAD_PROBE_ITERS", "10")))
        return

    class ProbeHarness(TorchHarness):
        def candidates(self, shape, routes, peers):
            own = super().candidates(shape, routes, peers)
            return own + candidates(self._inputs, self._ref, self.device, lib, fractions)

    runner._default_harness = lambda o: ProbeHarness(o.device, o.timer)
    app(["bench", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
