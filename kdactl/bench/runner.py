"""``kdactl bench``: check every candidate against the reference, warm up, time in ABBA blocks with
a cold L2, summarize, gate against the SKU baseline, and report.

The runner itself touches no GPU: everything device-side goes through a Harness (harness.py), so
tests drive this module with a fake one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdactl.atomic import write_text_atomic
from kdactl.bench import baseline as bl
from kdactl.bench.configs import CONFIGS
from kdactl.bench.model import ERROR, FAILED, OK, PEER_TIMED_LIMIT, PEERS, Candidate, Harness, Outcome, ShapeRun
from kdactl.bench.order import Plan, abba, plan
from kdactl.bench.progress import NullProgress, Progress, make_progress
from kdactl.bench.report import BenchReport, verdict
from kdactl.bench.stats import summarize
from kdactl.bench.suites import HOST_SHAPES, Shape, resolve_shapes
from kdactl.bench.timing import TIMERS
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, Inconclusive, UsageError
from kdactl.faults import fault_from_env
from kdactl.kda.routes import ROUTES
from kdactl.proc import sigterm_interrupts
from kdactl.settings import Settings

log = logging.getLogger("kdactl.bench")

KNOWN_ROUTES = ("auto", *ROUTES)
KNOWN_PEERS = (*PEERS, "fla-chunk")  # all = PEERS; fla-chunk: fla's chunk_kda without its recurrent kernel


@dataclass(frozen=True)
class BenchOptions:
    suite: str | None = None
    shapes: tuple[str, ...] = ()
    varlens: tuple[str, ...] = ()
    heads: int | None = None
    routes: str | None = None  # comma list; None: auto and every route of this build
    peers: str = "fla"  # comma list of PEERS, "all", or "none"
    config: str | None = None  # a name in CONFIGS for every shape; None: each suite's own, plain otherwise
    gate_params: str | None = None  # a name in GATE_PARAMS for every fused shape; None: the default
    iters: int = 24  # timed iterations per candidate and shape
    warmup: int = 3  # untimed calls per candidate first (fla autotunes on the first)
    gate: bool = False
    record_baseline: bool = False
    baseline: Path | None = None
    tolerance: float | None = None  # for --record-baseline; default: the old file's, else 0.10
    markdown: str | None = None  # FILE, or "-" for stdout instead of the table
    plot: Path | None = None
    device: int = 0
    timer: str = "auto"  # "auto" (kineto), or a timer by name: kdactl.bench.timing.TIMERS
    host: bool = False  # CPU cost per call (eager, graph replay) instead of device time
    as_json: bool = False


@dataclass(frozen=True)
class Request:
    """Options after checking: what the run will do."""

    shapes: list[Shape]
    routes: tuple[str, ...] | None
    peers: tuple[str, ...]
    plan: Plan
    options: BenchOptions = field(repr=False)


def _names(text: str, known: tuple[str, ...], option: str, words: str = "") -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise UsageError(f"{option} takes a comma list of {', '.join(known)}{words}; got {text!r}")
    return names


def check_options(o: BenchOptions) -> Request:
    """Every usage error (exit 2) is raised here, before any GPU is touched."""
    if o.config is not None and o.config not in CONFIGS:
        raise UsageError(f"--config must be one of {', '.join(CONFIGS)}, got {o.config!r}")
    shapes = resolve_shapes(o.suite, o.shapes, o.varlens, o.heads, default=HOST_SHAPES if o.host else None,
                            config=o.config, gate_params=o.gate_params)  # fmt: skip
    if o.host and (o.gate or o.record_baseline or o.plot is not None):
        raise UsageError("--host measures the CPU cost per call: it takes no --gate, --record-baseline or --plot")
    routes = _names(o.routes, KNOWN_ROUTES, "--routes") if o.routes is not None else None
    text = o.peers.strip()
    peers = (
        ()
        if text == "none"
        else PEERS
        if text == "all"
        else _names(o.peers, KNOWN_PEERS, "--peers", ", or all, or none")
    )
    if o.iters < 2:
        raise UsageError(f"--iters must be at least 2 (one ABBA round), got {o.iters}")
    if o.warmup < 1:
        raise UsageError(f"--warmup must be at least 1 (the first call compiles and autotunes), got {o.warmup}")
    if (o.gate or o.record_baseline) and routes is not None and "auto" not in routes:
        raise UsageError("--gate and --record-baseline judge the 'auto' route: add it to --routes")
    if o.markdown == "-" and o.as_json:
        raise UsageError("--markdown - and --json both want stdout: give --markdown a FILE")
    if o.plot is not None and Path(o.plot).suffix.lower() != ".png":
        raise UsageError(f"--plot takes a .png file name, got {str(o.plot)!r}")
    if o.tolerance is not None and not 0 <= o.tolerance < 10:
        raise UsageError(f"--tolerance must be in [0, 10), got {o.tolerance}")
    if o.plot is not None:
        _require_matplotlib()
    if o.timer not in ("auto", *TIMERS):
        raise UsageError(f"--timer must be one of auto, {', '.join(TIMERS)}; got {o.timer!r}")
    return Request(shapes, routes, peers, plan(o.iters), o)


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib (pip install 'kdactl[bench]')")


def _default_harness(o: BenchOptions) -> Harness:
    from kdactl.bench.harness import TorchHarness

    return TorchHarness(o.device, o.timer)


def run_bench(settings: Settings, options: BenchOptions, harness_factory: Callable[[BenchOptions], Harness] | None = None,
              progress: Progress | None = None) -> BenchReport:  # fmt: skip
    """The bench command: the report carries the exit code."""
    req = check_options(options)
    fault_from_env(settings.env)
    prog = progress or make_progress(options.as_json)
    runs: list[ShapeRun] = []
    harness = None
    # Under --json nothing but the one document may reach stdout: a library's print goes to stderr.
    guard = contextlib.redirect_stdout(sys.stderr) if options.as_json else contextlib.nullcontext()
    try:
        with guard:
            harness = (harness_factory or _default_harness)(options)  # NoGpu / Inconclusive end it here
            info = harness.info()
            path, old = _baseline_for(options, info)
            prog.start(len(req.shapes))
            stopped = _run_shapes(harness, req, runs, prog)
            if options.host and not stopped:
                info.update(harness.host_context())
    finally:
        prog.close()
        if harness is not None:
            harness.release()
    rows = bl.gate(runs, old, str(info.get("timer"))) if options.gate and old is not None and not stopped else []
    code, reasons = _judged(runs, rows, options.gate, stopped)
    report = BenchReport(
        info, req.plan, options.warmup, runs, rows, code, reasons, path, host=options.host, stopped=stopped
    )
    if options.record_baseline:
        assert path is not None  # _baseline_for names the file whenever a baseline is recorded
        _record(report, path, old, info, options.tolerance)
    _write_files(report, options)
    return report


def _judged(runs: list[ShapeRun], rows: list[bl.GateRow], gating: bool, stopped: str | None) -> tuple[int, list[str]]:
    """The verdict on what ran. A run stopped short judged nothing more than it found: wrong results
    already found still count against the node (1), anything else is inconclusive (3)."""
    code, reasons = verdict(runs, rows, gating=gating)
    if stopped:
        code, reasons = (code if code == EXIT_NOT_CERTIFIED else EXIT_INCONCLUSIVE), [*reasons, stopped]
    return code, reasons


def _run_shapes(harness: Harness, req: Request, runs: list[ShapeRun], prog: Progress | NullProgress) -> str | None:
    """Every shape in turn into ``runs``; None when all ran. Ctrl-C, or SIGTERM (a supervisor's time
    limit), ends the run at once and keeps the shapes already finished, so that a run cut short still
    reports and writes what it measured: the reason returned names the shapes it did not reach."""
    with sigterm_interrupts():
        try:
            for shape in req.shapes:
                runs.append(run_shape(harness, shape, req, prog))
                prog.advance()
        except KeyboardInterrupt:
            if not runs:
                raise  # nothing measured: the command ends as any interrupted one does
            left = [s.key for s in req.shapes[len(runs) :]]
            return f"interrupted after {len(runs)} of {len(req.shapes)} shapes; not measured: {', '.join(left)}"
    return None


def _baseline_for(o: BenchOptions, info: dict[str, Any]) -> tuple[Path | None, bl.Baseline | None]:
    if not (o.gate or o.record_baseline):
        return (Path(o.baseline) if o.baseline else None), None
    sku = str(info.get("sku") or "unknown")
    if o.baseline is None and sku == "unknown":
        raise Inconclusive(f"cannot pick a baseline: GPU {info.get('gpu')!r} has SKU 'unknown'; pass --baseline FILE")
    path = Path(o.baseline) if o.baseline else bl.default_path(sku)
    if not path.is_file():
        if o.gate:
            raise Inconclusive(f"no baseline at {path}: record one on this SKU with --record-baseline")
        return path, None
    return path, bl.load(path)


def _record(report: BenchReport, path: Path, old, info, tolerance) -> None:
    """Only a clean, whole run becomes a baseline: any own failure or error, or an interrupted run,
    leaves the file untouched."""
    code, reasons = _judged(report.runs, [], False, report.stopped)
    if code != 0:
        report.notes.append(f"baseline NOT written to {path}: the run did not pass ({'; '.join(reasons)})")
        return
    meta = {k: str(info.get(k)) for k in bl.RUN_META if info.get(k) is not None}
    new = bl.record(old, report.runs, str(info.get("sku") or "unknown"), meta, tolerance)
    bl.save(path, new)
    report.notes.append(f"baseline written to {path} ({len(new.shapes)} shapes, tolerance {new.tolerance:.0%})")


def _write_files(report: BenchReport, o: BenchOptions) -> None:
    if o.markdown and o.markdown != "-":
        write_text_atomic(Path(o.markdown), report.markdown())
        report.notes.append(f"markdown written to {o.markdown}")
    if o.plot is not None:
        report.plot(Path(o.plot))
        report.notes.append(f"plot written to {o.plot}")
    report.markdown_stdout = o.markdown == "-"


def run_shape(harness: Harness, shape: Shape, req: Request, prog: Progress | NullProgress) -> ShapeRun:
    """Check, warm up and time every candidate on one shape. Never raises for a candidate's fault."""
    run = ShapeRun(shape)
    prog.phase(f"{shape.key}: inputs, reference, checks")
    try:
        cands = harness.candidates(shape, req.routes, req.peers)
    except Exception as err:  # noqa: BLE001 - the shape is reported as not measured, the run goes on
        log.warning("%s: setup failed: %s: %s", shape.key, type(err).__name__, err)
        run.error = f"setup failed: {type(err).__name__}: {err}"
        return run
    live = _check_all(cands, run, prog)
    live = _warm_all(live, run, req.options.warmup, prog)
    if req.options.host:
        _host_all(harness, live, run, prog)
    else:
        _time_all(harness, live, run, req.plan, prog)
    return run


def _host_all(harness: Harness, live, run: ShapeRun, prog) -> None:
    for c, o in live:
        prog.phase(f"{run.shape.key}: host cost of {c.name}")
        try:
            o.host = harness.host_cost(c.run)
        except Exception as err:  # noqa: BLE001
            _fail(o, ERROR, f"host timing raised {type(err).__name__}: {err}")


def _fail(o: Outcome, status: str, why: str) -> None:
    o.status, o.reason = status, why
    log.warning("%s %s: %s", o.name, status, why)


def _check_all(cands: list[Candidate], run: ShapeRun, prog) -> list[tuple[Candidate, Outcome]]:
    live = []
    for c in cands:
        o = Outcome(c.name, c.kind, OK, note=c.note)
        run.outcomes.append(o)
        if c.reason is not None or c.run is None or c.check is None:
            o.status, o.reason = c.reason_status, c.reason or "not runnable"
            continue
        prog.phase(f"{run.shape.key}: checking {c.name}")
        try:
            o.check = c.check()
        except Exception as err:  # noqa: BLE001
            _fail(o, ERROR, f"check raised {type(err).__name__}: {err}")
            continue
        if o.check.detail:
            o.note = f"{o.note}; {o.check.detail}" if o.note else o.check.detail
        if not o.check.ok and (o.own or not o.check.within(PEER_TIMED_LIMIT)):
            _fail(o, FAILED, f"wrong result: error ratio o {o.check.o_err:.3g}, state {o.check.state_err:.3g} "
                             f"(limit {o.check.limit:g}); not timed")  # fmt: skip
            continue
        live.append((c, o))
    return live


def _warm_all(live, run: ShapeRun, warmup: int, prog):
    kept = []
    for c, o in live:
        prog.phase(f"{run.shape.key}: warming up {c.name}")
        try:
            for _ in range(warmup):
                c.run()
        except Exception as err:  # noqa: BLE001
            _fail(o, ERROR, f"warmup raised {type(err).__name__}: {err}")
            continue
        kept.append((c, o))
    return kept


def _time_all(harness: Harness, live, run: ShapeRun, p: Plan, prog) -> None:
    by_name = {c.name: (c, o) for c, o in live}
    schedule = abba(list(by_name), p.rounds)
    for i, name in enumerate(schedule):
        c, o = by_name[name]
        if o.status != OK:
            continue  # dropped after an error earlier in the schedule
        prog.phase(f"{run.shape.key}: timing {name} (block {i + 1}/{len(schedule)})")
        try:
            block = []
            for _ in range(p.block_size):
                harness.flush()
                block.append(float(harness.time_ms(c.run)))
            o.blocks.append(block)
        except Exception as err:  # noqa: BLE001
            _fail(o, ERROR, f"timing raised {type(err).__name__}: {err}")
    for _c, o in live:
        if o.status == OK:
            try:
                o.summary = summarize(o.blocks)
            except ValueError as err:
                _fail(o, ERROR, f"timing unusable: {err}")
            else:
                if not math.isfinite(o.summary.median_ms):
                    _fail(o, ERROR, "timing not finite")
