"""Per-SKU performance baselines (fleet/baselines/<SKU>.toml) and the regression gate.

A baseline holds, per shape key (its label, prefixed by a configuration other than plain), the median of ``auto`` on a real run of that SKU, and a
tolerance. The gate fails a shape only when it is slower than ``baseline * (1 + tolerance)`` and
the slowdown is clear of the run's own spread: even the run's fastest block median is over the
threshold. A shape that could not be measured, or has no baseline, makes the gate inconclusive.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kdactl.bench.model import OK, ShapeRun
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS, UsageError

SCHEMA = "kdactl.bench-baseline/v1"
DEFAULT_TOLERANCE = 0.10
GATED = "auto"  # the candidate a baseline records and the gate judges

PASS, REGRESSED, NOISE, NO_BASELINE, NOT_MEASURED = (
    "pass",
    "regressed",
    "slower-within-noise",
    "no-baseline",
    "not-measured",
)
# Within the threshold, but auto now runs another route than the one the baseline timed: the gate
# can no longer see that route's regressions until the baseline is recorded again.
ROUTE_CHANGED = "route-changed"
# The baseline was timed with another timer (or names none): its milliseconds are another quantity.
TIMER_MISMATCH = "timer-mismatch"


UNJUDGED = (NOT_MEASURED, NO_BASELINE, TIMER_MISMATCH)  # the gate could not say: inconclusive


RUN_META = ("gpu", "timer", "torch", "fla", "kernel_target")  # what a recording run says of itself


@dataclass(frozen=True)
class Entry:
    median_ms: float
    min_ms: float | None = None
    max_ms: float | None = None
    route: str | None = None  # what auto ran when it was recorded


@dataclass(frozen=True)
class Baseline:
    sku: str
    tolerance: float
    shapes: dict[str, Entry]
    meta: dict[str, str] = field(default_factory=dict)  # recorded_at, gpu, timer, versions


def default_path(sku: str) -> Path:
    from kdactl.assets import fleet_dir

    return fleet_dir() / "baselines" / f"{sku}.toml"


def load(path: Path) -> Baseline:
    """Read and check a baseline; a malformed one is a configuration error naming the key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"baseline {path}: not valid TOML: {err}") from None
    if data.get("schema") != SCHEMA:
        raise UsageError(f"baseline {path}: schema must be {SCHEMA!r}, got {data.get('schema')!r}")
    tol = data.get("tolerance")
    if not isinstance(tol, (int, float)) or not 0 <= tol < 10:
        raise UsageError(f"baseline {path}: tolerance must be a number in [0, 10), got {tol!r}")
    shapes = {}
    for label, row in (data.get("shapes") or {}).items():
        med = row.get("median_ms") if isinstance(row, dict) else None
        if not isinstance(med, (int, float)) or not (med > 0 and math.isfinite(med)):
            raise UsageError(f"baseline {path}: shapes.{label!r}.median_ms must be a positive number, got {med!r}")
        shapes[label] = Entry(float(med), row.get("min_ms"), row.get("max_ms"), row.get("route"))
    meta = {k: str(v) for k, v in data.items() if k not in ("schema", "tolerance", "shapes", "sku")}
    return Baseline(str(data.get("sku", "")), float(tol), shapes, meta)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    return json.dumps(str(v), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def dumps(b: Baseline) -> str:
    lines = ["# kdactl bench baseline: median ms of `auto` per shape, cold L2. Written by --record-baseline.",
             f"schema = {_value(SCHEMA)}", f"sku = {_value(b.sku)}", f"tolerance = {_value(float(b.tolerance))}"]  # fmt: skip
    lines += [f"{k} = {_value(v)}" for k, v in sorted(b.meta.items())]
    for label in sorted(b.shapes):
        e = b.shapes[label]
        lines += ["", f"[shapes.{json.dumps(label)}]", f"median_ms = {_value(float(e.median_ms))}"]
        lines += [
            f"{k} = {_value(v)}"
            for k, v in (("min_ms", e.min_ms), ("max_ms", e.max_ms), ("route", e.route))
            if v is not None
        ]
    return "\n".join(lines) + "\n"


def save(path: Path, b: Baseline) -> None:
    """Atomic (kdactl.atomic): readers see the old baseline or the new one."""
    from kdactl.atomic import write_text_atomic

    write_text_atomic(Path(path), dumps(b))


def record(
    old: Baseline | None, runs: Iterable[ShapeRun], sku: str, meta: dict[str, str], tolerance: float | None
) -> Baseline:
    """The old baseline with every shape measured now replaced; shapes not run are kept."""
    shapes = dict(old.shapes) if old else {}
    for run in runs:
        o = run.outcome(GATED)
        if o is None or o.status != OK or o.summary is None:
            continue
        s = o.summary
        shapes[run.shape.key] = Entry(round(s.median_ms, 6), round(s.min_ms, 6), round(s.max_ms, 6), _auto_route(o))
    tol = tolerance if tolerance is not None else (old.tolerance if old else DEFAULT_TOLERANCE)
    stamp = datetime.now(UTC).replace(microsecond=0).isoformat()
    # The run's facts (gpu, timer, versions) replace the old ones whole: a peer absent now is not kept.
    kept = {k: v for k, v in (old.meta if old else {}).items() if k not in RUN_META}
    return Baseline(sku, tol, shapes, {**kept, **meta, "recorded_at": stamp})


@dataclass(frozen=True)
class GateRow:
    label: str
    status: str
    measured_ms: float | None = None
    baseline_ms: float | None = None
    threshold_ms: float | None = None
    fastest_block_ms: float | None = None
    message: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _auto_route(outcome) -> str | None:
    """The route auto ran, from its note ("auto -> chunk", "auto -> small_bh (6 segments ...)")."""
    return outcome.note.split("->", 1)[-1].split()[0] if "->" in outcome.note else None


def judge(run: ShapeRun, baseline: Baseline) -> GateRow:
    label = run.shape.key
    o = run.outcome(GATED)
    entry = baseline.shapes.get(label)
    if o is None or o.status != OK or o.summary is None:
        why = run.error or (o.reason if o else None) or (f"{GATED} {o.status}" if o else f"{GATED} not run")
        return GateRow(label, NOT_MEASURED, message=f"could not measure {GATED}: {why}")
    s = o.summary
    if entry is None:
        return GateRow(
            label, NO_BASELINE, s.median_ms, message=f"no baseline for {label} (record one with --record-baseline)"
        )
    thr = entry.median_ms * (1 + baseline.tolerance)
    row = dict(measured_ms=s.median_ms, baseline_ms=entry.median_ms, threshold_ms=thr, fastest_block_ms=s.block_lo_ms)
    said = f"measured {s.median_ms:.4g} ms, baseline {entry.median_ms:.4g} ms, threshold {thr:.4g} ms (+{baseline.tolerance:.0%})"
    if s.median_ms <= thr:
        now = _auto_route(o)
        if entry.route and now and now != entry.route:
            return GateRow(label, ROUTE_CHANGED, **row, message=f"{said}; the baseline timed route {entry.route}, auto "
                           f"now runs {now}: record the baseline again (--record-baseline)")  # fmt: skip
        return GateRow(label, PASS, **row, message=said)
    if s.block_lo_ms > thr:
        return GateRow(
            label, REGRESSED, **row, message=f"{said}; even the fastest block ({s.block_lo_ms:.4g} ms) is over"
        )
    return GateRow(
        label, NOISE, **row, message=f"{said}; within the run's spread (fastest block {s.block_lo_ms:.4g} ms)"
    )


def gate(runs: Iterable[ShapeRun], baseline: Baseline, timer: str) -> list[GateRow]:
    """Each shape judged against the baseline; none when the baseline was timed with another timer
    than this run's: that is inconclusive, never a pass or a regression."""
    runs = list(runs)
    recorded = baseline.meta.get("timer")
    if recorded != timer:
        why = (
            (
                f"the baseline was timed with {recorded!r}, this run with {timer!r}: not comparable; record the "
                f"baseline again with this timer, or run with --timer {recorded}"
            )
            if recorded
            else f"the baseline names no timer, this run used {timer!r}: not comparable; record the baseline again"
        )
        return [GateRow(r.shape.key, TIMER_MISMATCH, message=why) for r in runs]
    return [judge(r, baseline) for r in runs]


def gate_exit(rows: list[GateRow]) -> int:
    """1 on any clear regression; else 3 when any shape could not be judged; else 0."""
    if any(r.status == REGRESSED for r in rows):
        return EXIT_NOT_CERTIFIED
    if not rows or any(r.status in UNJUDGED for r in rows):
        return EXIT_INCONCLUSIVE
    return EXIT_PASS
