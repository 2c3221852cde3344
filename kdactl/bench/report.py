"""The bench report: verdict, terminal table, JSON, markdown and a PNG plot.

Tables have a row per shape with each candidate's median (ms) and its ratio to ``auto``
(candidate / auto: above 1 means auto is faster), and a geomean row. A candidate that did not run
shows why: ``—`` for a route or peer that rejects the shape or its configuration, ``FAILED`` for a
wrong result, ``ERROR`` for a crash, ``n/a`` for a peer that is not installed; the reasons are
listed under the table. A second table gives each candidate's error ratios against the reference
(o / final state), and the configurations of the run are spelled out with their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kdactl.bench import baseline as bl
from kdactl.bench.configs import CONFIGS
from kdactl.bench.host import CALLS as HOST_CALLS
from kdactl.bench.host import REPEATS as HOST_REPEATS
from kdactl.bench.model import ERROR, FAILED, OK, PEER_TIMED_LIMIT, REJECTED, UNAVAILABLE, ShapeRun
from kdactl.bench.order import Plan
from kdactl.bench.stats import geomean
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS

MARK = {REJECTED: "—", FAILED: "FAILED", ERROR: "ERROR", UNAVAILABLE: "n/a"}
IMPRECISE = "*"  # a peer timed over the SPEC's error ratio limit (model.PEER_TIMED_LIMIT)
SCHEMA = "kdactl.bench/v1"


def verdict(runs: list[ShapeRun], gate_rows: list[bl.GateRow], gating: bool) -> tuple[int, list[str]]:
    """1: one of kdactl's own kernels gave a wrong result, or a clear regression; 3: something that
    should have been measured was not; 0 otherwise. Peers never change the exit code."""
    wrong, missing = [], []
    for r in runs:
        if r.error:
            missing.append(f"{r.shape.key}: {r.error}")
        for o in r.outcomes:
            if o.own and o.status == FAILED:
                wrong.append(f"{r.shape.key} {o.name}: {o.reason}")
            elif o.own and o.status == ERROR:
                missing.append(f"{r.shape.key} {o.name}: {o.reason}")
    wrong += [f"{g.label}: regression: {g.message}" for g in gate_rows if g.status == bl.REGRESSED]
    if gating:
        missing += [f"{g.label}: {g.message}" for g in gate_rows if g.status in bl.UNJUDGED]
    if not any(o.status == OK and o.own for r in runs for o in r.outcomes):
        missing.append("no kdactl kernel was measured")
    if wrong:
        return EXIT_NOT_CERTIFIED, wrong + missing
    return (EXIT_INCONCLUSIVE, missing) if missing else (EXIT_PASS, [])


def columns(runs: list[ShapeRun]) -> list[str]:
    """Candidate names in first-seen order, auto first."""
    names: dict[str, None] = {}
    for r in runs:
        for o in r.outcomes:
            names.setdefault(o.name)
    return sorted(names, key=lambda n: n != "auto")


def cell(run: ShapeRun, name: str) -> str:
    o = run.outcome(name)
    if o is None:
        return "" if not run.error else "ERROR"
    if o.status != OK or o.summary is None:
        return MARK.get(o.status, o.status)
    ms, auto = o.summary.median_ms, run.median("auto")
    mark = IMPRECISE if o.imprecise else ""
    return f"{ms:.3f}{mark}" if name == "auto" or auto is None else f"{ms:.3f}{mark} ({ms / auto:.2f}x)"


def geomeans(runs: list[ShapeRun]) -> dict[str, dict[str, Any]]:
    """Per candidate: geomean ms over the shapes it ran, and geomean ratio to auto where both ran."""
    out = {}
    for name in columns(runs):
        ms = [m for r in runs if (m := r.median(name)) is not None]
        ratios = [m / a for r in runs if (m := r.median(name)) is not None and (a := r.median("auto"))]
        out[name] = {"ms": geomean(ms), "ratio_vs_auto": geomean(ratios), "shapes": len(ms)}
    return out


def _geo_cell(g: dict[str, Any], name: str, nshapes: int) -> str:
    if g["ms"] is None:
        return "—"
    text = f"{g['ms']:.3f}"
    if name != "auto" and g["ratio_vs_auto"] is not None:
        text += f" ({g['ratio_vs_auto']:.2f}x)"
    return text + (f" [{g['shapes']}/{nshapes}]" if g["shapes"] != nshapes else "")


def error_cell(run: ShapeRun, name: str) -> str:
    o = run.outcome(name)
    if o is None or o.check is None:
        return "" if o is None else MARK.get(o.status, o.status)
    return f"{o.check.o_err:.2e} / {o.check.state_err:.2e}"


def error_rows(runs: list[ShapeRun]) -> tuple[list[str], list[list[str]]]:
    """Error ratio against the reference, o / final state, per candidate checked (FAILED ones too)."""
    names = columns(runs)
    return ["shape"] + [f"{n} err o / S" for n in names], [
        [r.shape.key] + [error_cell(r, n) for n in names] for r in runs
    ]


def configs_used(runs: list[ShapeRun]) -> dict[str, dict[str, str]]:
    """Each configuration in the run (with its gate parameters unless the default), keyed as the
    shapes' keys prefix it: what it computes and which inputs it was given."""
    used: dict[str, dict[str, str]] = {}
    for r in runs:
        config = CONFIGS[r.shape.config]
        used.setdefault(r.shape.config_key, {"summary": config.summary, "inputs": config.inputs(r.shape.gate_params)})
    return used


def config_lines(runs: list[ShapeRun]) -> list[str]:
    return [f"config {name}: {c['summary']}; inputs: {c['inputs']}" for name, c in configs_used(runs).items()]


HOST_TITLE = "kdactl bench --host (CPU us per call; (x) = candidate / auto, >1: auto cheaper)"


def _us(value: float | None, auto: float | None, name: str) -> str:
    if value is None:
        return "—"
    return f"{value:.1f}" if name == "auto" or not auto else f"{value:.1f} ({value / auto:.2f}x)"


def host_rows(runs: list[ShapeRun]) -> tuple[list[str], list[list[str]]]:
    """--host: a column pair (eager, replay) per candidate, a row per shape."""
    names = columns(runs)
    head = ["shape"] + [f"{n} {what} us" for n in names for what in ("eager", "replay")]
    body = []
    for r in runs:
        auto = r.outcome("auto")
        base = auto.host if auto is not None and auto.status == OK else None
        row = [r.shape.key]
        for n in names:
            o = r.outcome(n)
            if o is None or o.status != OK or o.host is None:
                mark = "" if o is None else MARK.get(o.status, o.status)
                row += [mark, mark]
                continue
            row += [
                _us(o.host.eager_us, base.eager_us if base else None, n),
                _us(o.host.replay_us, base.replay_us if base else None, n),
            ]
        body.append(row)
    return head, body


@dataclass
class BenchReport:
    info: dict[str, Any]
    plan: Plan
    warmup: int
    runs: list[ShapeRun]
    gate_rows: list[bl.GateRow]
    exit_code: int
    reasons: list[str]
    baseline_path: Path | None = None
    notes: list[str] = field(default_factory=list)
    markdown_stdout: bool = False
    host: bool = False  # --host: the CPU cost per call, not device time
    stopped: str | None = None  # why the run ended before its last shape (Ctrl-C, SIGTERM)

    def method(self) -> str:
        i = self.info
        if self.host:
            cost = next((o.host for r in self.runs for o in r.outcomes if o.host), None)
            calls, repeats = (cost.calls, cost.repeats) if cost else (HOST_CALLS, HOST_REPEATS)
            return (f"GPU {i.get('gpu')} (sku {i.get('sku')}, target {i.get('kernel_target')}); CPU time per call of "
                    f"{calls} calls issued back to back (device synchronized before and after, outside the span), "
                    f"median of {repeats} repeats; replay: the call captured once in a CUDA graph; each candidate "
                    f"checked against the reference first; {self.warmup} warmup calls; replay floor on this node "
                    f"(torch CUDA graph of one tiny kernel) {i.get('replay_floor_us')} us; kdactl's plans kept by "
                    f"{i.get('plans')}; torch {i.get('torch')}, fla {i.get('fla')}")  # fmt: skip
        return (f"GPU {i.get('gpu')} (sku {i.get('sku')}, target {i.get('kernel_target')}); timer {i.get('timer')}"
                f" ({i.get('timer_note')}); cold L2: {int(i.get('flush_bytes') or 0) >> 20} MiB zeroed before every "
                f"iteration, outside the timed span; {self.warmup} warmup calls; {self.plan.iterations} timed "
                f"iterations per candidate in {2 * self.plan.rounds} ABBA blocks of {self.plan.block_size}; "
                f"median of block medians; torch {i.get('torch')}, fla {i.get('fla')}")  # fmt: skip

    def rows(self) -> tuple[list[str], list[list[str]]]:
        if self.host:
            return host_rows(self.runs)
        names = columns(self.runs)
        body = [[r.shape.key] + [cell(r, n) for n in names] for r in self.runs]
        g = geomeans(self.runs)
        body.append(["geomean"] + [_geo_cell(g[n], n, len(self.runs)) for n in names])
        return ["shape"] + [f"{n} ms" for n in names], body

    def problems(self) -> list[str]:
        out = [f"{r.shape.key}: {r.error}" for r in self.runs if r.error]
        out += [
            f"{r.shape.key} {o.name} [{o.status}]: {o.reason}" for r in self.runs for o in r.outcomes if o.status != OK
        ]
        out += [f"{r.shape.key} {o.name} {IMPRECISE}: timed, but its error ratio (o {c.o_err:.2e}, state "
                f"{c.state_err:.2e}) is over the SPEC's {c.limit:g} (a peer is timed up to {PEER_TIMED_LIMIT:g})"
                for r in self.runs for o in r.outcomes if o.imprecise and (c := o.check) is not None]  # fmt: skip
        out += [f"{r.shape.key} {o.name}: no replay figure: {o.host.replay_note}" for r in self.runs for o in r.outcomes
                if o.host is not None and o.host.replay_note]  # fmt: skip
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "exit_code": self.exit_code, "reasons": self.reasons, "stopped": self.stopped,
            "info": self.info,
            "method": {**self.plan.to_json(), "warmup": self.warmup, "statistic": "median of block medians",
                       "ratio": "candidate median / auto median (>1: auto faster)"},
            "configs": configs_used(self.runs),
            "shapes": [{"shape": r.shape.to_json(), "error": r.error, "candidates": [o.to_json() for o in r.outcomes]}
                       for r in self.runs],
            "geomean": geomeans(self.runs),
            "gate": {"baseline": str(self.baseline_path) if self.baseline_path else None,
                     "rows": [g.to_json() for g in self.gate_rows]} if self.gate_rows else None,
            "notes": self.notes,
        }  # fmt: skip

    def render(self, console: Console) -> None:
        if self.markdown_stdout:
            console.print(self.markdown(), markup=False, highlight=False)
            return
        head, body = self.rows()
        title = HOST_TITLE if self.host else "kdactl bench (median ms; (x) = candidate / auto, >1: auto faster)"
        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="left" if h == "shape" else "right")
        for i, row in enumerate(body):
            table.add_row(*row, end_section=not self.host and i == len(body) - 2)
        console.print(table)
        if not self.host:
            head, body = error_rows(self.runs)
            errors = Table(title="error ratio vs the reference (o / final state; limit 5e-3)")
            for h in head:
                errors.add_column(h, justify="left" if h == "shape" else "right")
            for row in body:
                errors.add_row(*row)
            console.print(errors)
        console.print(self.method(), markup=False)
        for line in config_lines(self.runs):
            console.print(line, markup=False)
        for line in self.problems():
            console.print(f"  {line}", markup=False)
        for g in self.gate_rows:
            console.print(f"gate {g.label}: {g.status}: {g.message}", markup=False)
        for n in self.notes:
            console.print(n, markup=False)
        word = {EXIT_PASS: "pass", EXIT_NOT_CERTIFIED: "FAIL", EXIT_INCONCLUSIVE: "INCONCLUSIVE"}[self.exit_code]
        peers_wrong = sum(o.status == FAILED and not o.own for r in self.runs for o in r.outcomes)
        tail = (
            f" ({peers_wrong} peer result(s) wrong, listed above; peers do not change the exit code)"
            if peers_wrong
            else ""
        )
        console.print(f"bench: {word}" + (": " + "; ".join(self.reasons) if self.reasons else "") + tail, markup=False)

    def markdown(self) -> str:
        lines = [f"**Incomplete**: {self.stopped}.", ""] if self.stopped else []
        lines += md_table(*self.rows())
        if not self.host:
            lines += [
                "",
                "Error ratio against the reference (o / final state; limit 5e-3):",
                "",
                *md_table(*error_rows(self.runs)),
            ]
        lines += ["", f"Method: {self.method()}.", "", HOST_TITLE if self.host else
                  "(x) = candidate median / auto median; above 1, auto is faster."]  # fmt: skip
        lines += [f"- {line}" for line in config_lines(self.runs)]
        lines += [f"- {line}" for line in route_lines(self.runs)]
        lines += [f"- {p}" for p in self.problems()]
        lines += [f"- gate {g.label}: **{g.status}**: {g.message}" for g in self.gate_rows]
        return "\n".join(lines) + "\n"

    def plot(self, path: Path) -> None:
        from kdactl.bench.plot import plot_runs

        plot_runs(self.runs, columns(self.runs), path, title=f"KDA prefill on {self.info.get('gpu')} (cold L2)")


def route_lines(runs) -> list[str]:
    """Where kdactl's own candidates ran: auto's route, and how a route cut the shape (small_bh's segments)."""
    return [f"{r.shape.key} {o.name}: {o.note}" for r in runs for o in r.outcomes if o.own and o.note]


def md_table(head: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table's lines: the first column left-aligned, the others (figures) right-aligned."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in body]
