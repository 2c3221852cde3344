"""``kdactl bench`` with one more candidate: tools/fused_probe.cu, route small_bh's prepare and
recurrence fused into one kernel (a measurement of that design, not a route). It is built here with
nvcc for sm_90a, then checked and timed beside the candidates the command line asks for, in the same
run, by the same harness (fp32 reference first, cold L2, ABBA, the chosen timer):

    python3 tools/fused_probe.py --suite production --config lower-bound --gate-params flashkda \\
        --routes auto --peers cudnn --iters 3 --warmup 1 --markdown probe.md

Every argument is kdactl bench's. Two candidates join each fixed-length shape:
  probe       the fused kernel, one CTA an SM: segments = SMs / (batch x heads) per sequence;
  small_bh@S  route small_bh cut into the probe's segments (S chunks each), the same arithmetic: the
              probe's check also requires its o and final state to equal this one's bit for bit.
The probe covers fixed-length batches, K = V = 128, bf16 q, k, v and g, and segments that start warm
within 4 chunks (the lower-bound gate at FlashKDA's draw); elsewhere it is reported as not run, with why.

FUSED_PROBE_VARIANTS="NAME=DEFINE[,DEFINE] ..." builds more probes with fused_probe.cu's variants, one
candidate each. ``--raw B,T,H ...`` times the probes and small_bh at the probe's segments with CUDA events
instead (warm L2, FUSED_PROBE_ITERS calls, median), unchecked, so that the timing-only variants run too,
and prints PROBE_TRACE's cycles a chunk per phase:

    FUSED_PROBE_VARIANTS="trace=PROBE_TRACE nowalk=PROBE_NO_WALK" python3 tools/fused_probe.py --raw 1,32768,12
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fused_probe.cu")
CSRC = Path(__file__).resolve().parent.parent / "csrc"
TARGET = "sm_90a"
WARM_CHUNKS = 4  # the probe's walk back before a segment (tools/fused_probe.cu)
# prepare_chunk's phases (kda_chunk.cuh, PrepPhase), then the prepare warp's wait for a free stage
PHASES = ("staged", "normed", "summed", "products", "solved", "planes", "done", "stage wait")


def compile_command(so: Path, defines: tuple[str, ...] = (), source: Path = SOURCE) -> list[str]:
    """nvcc's command for a probe's library from ``source`` (a .cu beside this file that includes csrc's
    kernel headers): the kernel library's flags for sm_90a, and -D``defines`` (the variants of
    fused_probe.cu)."""
    from kdactl.jit.spec import COMMON_CFLAGS
    from kdactl.targets import TARGETS

    target = TARGETS[TARGET]
    return ["nvcc", target.gencode, f"-D{target.define}", *COMMON_CFLAGS, "-Xptxas", "-v", "-shared", "-cudart=static",
            *(f"-D{d}" for d in defines), f"-I{CSRC}", str(source), "-o", str(so)]  # fmt: skip


def build(out_dir: Path, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The probe's library (compile_command); ptxas' register and spill lines for its kernel go to stderr."""
    from kdactl.kernel_abi import KdaArgs

    so = out_dir / f"libkdactl_fused_probe{''.join('-' + d for d in defines)}.so"
    done = subprocess.run(compile_command(so, defines), capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"nvcc failed ({done.returncode}):\n{done.stderr[-4000:]}")
    lines = done.stderr.splitlines()
    for i, line in enumerate(lines):
        if "Function properties for" in line and "fused_probe" in line:
            print(
                f"fused_probe {' '.join(defines)} ptxas:",
                " | ".join(x.strip() for x in lines[i + 1 : i + 3]),
                file=sys.stderr,
            )
    lib = ctypes.CDLL(str(so))
    lib.kdactl_fused_probe.argtypes = (ctypes.POINTER(KdaArgs), ctypes.c_void_p)
    lib.kdactl_fused_probe.restype = ctypes.c_int
    return lib


def probe_segment_chunks(batch: int, heads: int, seqlen: int, sms: int) -> int:
    """Chunks a segment so that the probe's grid is about one CTA an SM."""
    chunks = math.ceil(seqlen / 16)
    per_sequence = max(1, sms // (batch * heads))
    return math.ceil(chunks / per_sequence)


def unsupported(x) -> str | None:
    """Why the probe cannot run these inputs, or None."""
    q, v = x["q"], x["v"]
    if x["cu_seqlens"] is not None:
        return "the probe runs fixed-length batches only"
    if q.shape[-1] != 128 or v.shape[-1] != 128 or q.dtype != torch.bfloat16 or x["g"].dtype != torch.bfloat16:
        return "the probe runs K = V = 128 with bf16 q, k, v and g only"
    return None


class Calls:
    """One shape's launches through kdactl's launch path (kdactl.kda.launch.LaunchPlan): route small_bh
    cut into the probe's segments (``twin``), and the probe's libraries in its place (``probe``), each
    into outputs of its own. ``route_plan``: small_bh's own segments instead (tools/overlap_probe.py)."""

    def __init__(self, x, device, route_plan: bool = False):
        from kdactl.kda.device import device_info

        q, v = x["q"], x["v"]
        self.x, self.device, self.dev = x, device, device_info(device.index or 0)
        self.batch, self.heads = q.shape[0], v.shape[2]
        self.seg = None if route_plan else probe_segment_chunks(self.batch, self.heads, q.shape[1], self.dev.sm_count)
        self.problem, _, lp = self.plan(None, None)
        self.seg = lp.template.segment_chunks

    def plan(self, out, workspace):
        """(problem, call, LaunchPlan) of route small_bh at this shape's segments, into ``out`` (o, final
        state) with ``workspace``."""
        from kdactl.kda.call import PrefillCall
        from kdactl.kda.device import kernels
        from kdactl.kda.launch import LaunchPlan
        from kdactl.kda.routes import ROUTE_IDS
        from kdactl.kda.validation import validate_call

        x, config = self.x, self.x["config"]
        call = PrefillCall(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"], out=out,
                           workspace=workspace, output_final_state=True, route="small_bh", fused=config.fused_spec(),
                           state_v_first=config.state_v_first)  # fmt: skip
        problem, call = validate_call(call, runtime=True)
        lp = LaunchPlan.of(problem, self.dev, ROUTE_IDS["small_bh"], call)
        if self.seg is not None:
            lp.template.segment_chunks = self.seg
            lp.need = kernels().workspace_bytes(ROUTE_IDS["small_bh"], lp.template)
        return problem, call, lp

    def outputs(self):
        o = torch.empty_like(self.x["v"])
        return o, torch.empty(
            self.batch, self.heads, *self.problem.state_shape, dtype=torch.float32, device=self.device
        )

    def twin(self):
        """(run, outputs) of small_bh at the probe's segments."""
        out = self.outputs()
        _, call, lp = self.plan(out, None)
        call = call._replace(workspace=torch.empty(lp.need, dtype=torch.uint8, device=self.device))

        def run():
            lp.launch(call, *out)
            return out

        return run, out

    def probe(self, lib: ctypes.CDLL):
        """(run, outputs, workspace): the probe's launch. The workspace, zeroed here once, holds the flag
        (its first word: nonzero once a segment of a call did not start warm, ``cold``) and, from byte
        64 on, PROBE_TRACE's sums."""
        out = self.outputs()
        workspace = torch.zeros(256, dtype=torch.uint8, device=self.device)
        _, call, lp = self.plan(out, workspace)
        lp.kernel, lp.need, lp.slow, lp.what = lib.kdactl_fused_probe, workspace.numel(), False, "the fused probe"

        def run():
            lp.launch(call, *out)
            return out

        return run, out, workspace


def cold(workspace: torch.Tensor) -> bool:
    """Whether a probe call on this workspace (Calls.probe) met a segment that did not start warm."""
    return bool(workspace[:4].any())


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe's launch on one shape: ``run()`` writes (o, final state) into ``out`` and returns it;
    after a call, ``refused()`` says why its results do not count (a segment that did not start warm), or None."""

    run: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    out: tuple[torch.Tensor, torch.Tensor]
    refused: Callable[[], str | None]
    note: str


def checked_candidates(x, ref, calls: Calls, probes: dict[str, Probe]):
    """small_bh at the segments of ``calls`` and each probe, as kdactl.bench candidates: a probe runs once,
    then is either not run (refused, with why) or checked against the reference, where its o and final
    state must also be small_bh's bit for bit (the same arithmetic must give the same bits)."""
    from kdactl.bench.candidates import checker, poisoned
    from kdactl.bench.model import Candidate, Check

    config, seg = x["config"], calls.seg
    twin_name = f"small_bh@{seg}"
    run_twin, twin_out = calls.twin()
    out = [Candidate(twin_name, "route", run=run_twin, check=checker(poisoned(run_twin, *twin_out), ref, config.state_v_first),
                     note=f"small_bh, {seg} chunks a segment")]  # fmt: skip
    for name, probe in probes.items():
        probe.run()
        torch.cuda.synchronize(calls.device)
        why = probe.refused()
        if why:
            out.append(Candidate(name, "route", reason=why))
            continue
        check = checker(poisoned(probe.run, *probe.out), ref, config.state_v_first)

        def checked(check=check, probe_out=probe.out) -> Check:
            result = check()
            run_twin()
            same = all(torch.equal(a, b) for a, b in zip(probe_out, twin_out, strict=True))
            detail = f"{seg} chunks a segment; {'bitwise equal to' if same else 'differs from'} {twin_name}"
            if not same:  # the same arithmetic must give the same bits: a difference is a bug
                return dataclasses.replace(result, o_err=float("inf"), detail=detail)
            return dataclasses.replace(result, detail=detail)

        out.append(Candidate(name, "route", run=probe.run, check=checked, note=probe.note))
    return out


def probe_candidates(x, ref, device, libs: dict[str, ctypes.CDLL]):
    """Each probe library's candidate and small_bh at the probe's segments, for one shape's inputs
    (kdactl.bench.candidates): checked_candidates."""
    from kdactl.bench.model import Candidate

    why = unsupported(x)
    if why:
        return [Candidate(name, "route", reason=why) for name in libs]
    calls = Calls(x, device)
    refusal = f"a segment does not start warm within {WARM_CHUNKS} chunks (the probe does not stitch)"
    probes = {}
    for name, lib in libs.items():
        run, probe_out, workspace = calls.probe(lib)
        probes[name] = Probe(run, probe_out, lambda ws=workspace: refusal if cold(ws) else None,
                             f"fused, {calls.seg} chunks a segment")  # fmt: skip
    return checked_candidates(x, ref, calls, probes)


def raw_times(shapes: list[str], libs: dict[str, ctypes.CDLL], iters: int = 10) -> None:
    """Median ms of each library's probe (timing-only variants too: their results are not checked) and of
    small_bh at the same segments, per lower-bound shape at FlashKDA's draw; CUDA events, warm L2."""
    from kdactl.bench.candidates import make_inputs
    from kdactl.bench.suites import parse_shape
    from kdactl.bench.timing import EventTimer

    device = torch.device("cuda", 0)
    timer = EventTimer(device)
    torch.set_grad_enabled(False)
    for text in shapes:
        shape = dataclasses.replace(parse_shape(text), config="lower-bound", gate_params="flashkda")
        x = make_inputs(shape, device)
        calls = Calls(x, device)
        runs = {f"small_bh@{calls.seg}": calls.twin()[0]}
        traces = {}
        for name, lib in libs.items():
            run, _, workspace = calls.probe(lib)
            run()
            torch.cuda.synchronize(device)
            runs[name + (" (cold: not all warm)" if cold(workspace) else "")] = run
            traces[name] = workspace
        for name, run in runs.items():
            for _ in range(min(3, iters)):
                run()
            times = [timer.time_ms(run) for _ in range(iters)]
            print(f"{shape.label} {name}: {sorted(times)[len(times) // 2]:.3f} ms", flush=True)
        for name, workspace in traces.items():  # PROBE_TRACE: cycles a chunk in each phase (zero elsewhere)
            sums = workspace[64 : 64 + 8 * (len(PHASES) + 1)].view(torch.int64).tolist()
            if sums[-1]:
                print(f"{shape.label} {name} cycles a chunk:",
                      ", ".join(f"{p} {x / sums[-1]:.0f}" for p, x in zip(PHASES, sums, strict=False)), flush=True)  # fmt: skip


def main(argv: list[str]) -> None:
    """kdactl bench's arguments; FUSED_PROBE_VARIANTS="name=DEF,DEF name2=DEF" adds candidates built
    with those defines. ``--raw B,T,H ...``: raw_times instead of the bench (FUSED_PROBE_ITERS calls each)."""
    import os

    import kdactl.bench.runner as runner
    from kdactl.bench.harness import TorchHarness
    from kdactl.cli import app

    out_dir = Path(tempfile.mkdtemp(prefix="kdactl_fused_probe_"))
    libs = {"probe": build(out_dir)}
    for spec in os.environ.get("FUSED_PROBE_VARIANTS", "").split():
        name, _, defines = spec.partition("=")
        libs[name] = build(out_dir, tuple(d for d in defines.split(",") if d))
    if argv[:1] == ["--raw"]:
        raw_times(argv[1:], libs, int(os.environ.get("FUSED_PROBE_ITERS", "10")))
        return

    class ProbeHarness(TorchHarness):
        def candidates(self, shape, routes, peers):
            own = super().candidates(shape, routes, peers)
            return own + probe_candidates(self._inputs, self._ref, self.device, libs)

    runner._default_harness = lambda o: ProbeHarness(o.device, o.timer)
    app(["bench", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
