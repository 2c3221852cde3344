"""``kdactl fleet report``: what the stored certificates say about the fleet, computed in SQL.

Sections, all over each node's latest certificate (kdactl.fleet.queries):
  summary   one row per SKU: nodes certified / not certified / inconclusive / expired (said certified,
            now lapsed) / expiring within a day, CC, SMs, CUDA, target, suite checks, sanitizer failures;
            a totals row last;
  kinds     each kind of problem (a failed check, an error, expiry, drift, a fault) with its node count;
  perf      per SKU and shape: median measured over the GPUs against the median baseline, and the
            geomean of measured/baseline per SKU;
  problems  a page (--limit, --offset) of the nodes not certified, expired, drifted or fault-injected,
            most severe first, each with its problems (bounded).
A node counts as certified only when its latest certificate says so and has not expired: missing
evidence is never a pass, so a SKU whose nodes ran no sanitizer says "not run", not 0 errors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kdactl.certify.certificate import now_utc, parse_stamp, stamp
from kdactl.errors import UsageError
from kdactl.fleet import queries
from kdactl.fleet.store import Store, db_target
from kdactl.fleet.text import clip

DEFAULT_TOLERANCE = 0.10
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000
EXPIRING_WITHIN = timedelta(days=1)
CELL_MAX = 120  # any one value in a cell
PROBLEMS_MAX = 8  # problem lines per node; more are counted
FORMATS = ("table", "markdown", "json", "html")
SEVERITY = ("not certified", "inconclusive", "expired", "drifted", "fault injected")


@dataclass
class FleetReport:
    generated_at: str
    since: str | None
    certificates: int = 0
    nodes: int = 0
    summary: list[dict[str, Any]] = field(default_factory=list)
    kinds: list[dict[str, Any]] = field(default_factory=list)
    perf: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    problem_nodes: int = 0  # all flagged nodes; ``problems`` is the page from ``offset``
    offset: int = 0
    limit: int = DEFAULT_LIMIT
    left_out: list[str] = field(default_factory=list)  # rows of an older store that were not certificates
    fmt: str = "table"
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"command": "fleet report", "generated_at": self.generated_at, "since": self.since,
                "certificates": self.certificates, "nodes": self.nodes, "summary": self.summary,
                "problem_kinds": self.kinds, "perf": self.perf,
                "problems": {"nodes": self.problem_nodes, "offset": self.offset, "limit": self.limit,
                             "rows": self.problems},
                "left_out": self.left_out, "exit_code": self.exit_code}  # fmt: skip

    def render(self, console: Any) -> None:
        from kdactl.fleet import render

        render.render(self, console, self.fmt)


# ---------------------------------------------------------------------------------------------
# Pure parts


def joined(values: Iterable[Any]) -> str:
    seen = sorted({str(v) for v in values if v not in (None, "-")})
    return clip(", ".join(seen), CELL_MAX) if seen else "-"


def log_ratio(measured: float, baseline: float | None) -> float | None:
    """log(measured / baseline), taken apart so that no quotient under- or overflows (1e-320 / 1e300)."""
    if baseline is None or not (measured > 0 and baseline > 0 and math.isfinite(measured) and math.isfinite(baseline)):
        return None
    return math.log(measured) - math.log(baseline)


def geomean_ratio(logs: list[float]) -> float:
    return _exp(sum(logs) / len(logs))


def _exp(x: float) -> float:
    return math.exp(min(x, 700.0))  # beyond e^700 is "infinitely slower" for any reader; exp() would raise


def worse_by(last: float, median: float, unit: str) -> float:
    """How much worse ``last`` is than ``median``: slower for time units, lower for the others."""
    if unit in queries.LOWER_IS_BETTER:
        return _exp(math.log(last) - math.log(median)) - 1
    return 1 - _exp(math.log(last) - math.log(median))


def summary_rows(counts: list[tuple], facts: list[tuple]) -> list[dict[str, Any]]:
    by_sku: dict[str, list[tuple]] = {}
    for f in facts:
        by_sku.setdefault(f[0], []).append(f)
    rows = []
    for sku, nodes, ok, bad, unsure, lapsed, soon, passed, total, runs, errors in counts:
        fs = by_sku.get(sku, [])
        rows.append({"sku": clip(sku, CELL_MAX), "nodes": nodes, "certified": ok, "not_certified": bad, "inconclusive": unsure,
                     "expired": lapsed, "expiring_1d": soon, "cc": joined(f[1] for f in fs),
                     "sm_count": joined(f[2] for f in fs), "target": joined(f[3] for f in fs),
                     "cuda": joined(f[4] for f in fs), "suite_passed": int(passed), "suite_total": int(total),
                     "sanitizer_runs": int(runs), "sanitizer_errors": int(errors) if runs else None})  # fmt: skip
    if len(rows) > 1:
        rows.append(_totals(rows))
    return rows


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summed = ("nodes", "certified", "not_certified", "inconclusive", "expired", "expiring_1d", "suite_passed",
              "suite_total", "sanitizer_runs")  # fmt: skip
    out: dict[str, Any] = {"sku": "all", "cc": "-", "sm_count": "-", "target": "-", "cuda": "-"}
    out.update({k: sum(int(r[k]) for r in rows) for k in summed})
    errors = [r["sanitizer_errors"] for r in rows if r["sanitizer_errors"] is not None]
    out["sanitizer_errors"] = sum(errors) if errors else None
    return out


def perf_rows(medians: list[tuple]) -> list[dict[str, Any]]:
    """Rows per (SKU, shape, unit), then one geomean row per SKU over the shapes with a baseline."""
    rows: list[dict[str, Any]] = []
    logs: dict[str, list[float]] = {}
    for sku, shape, unit, n, m, b in medians:
        lr = log_ratio(m, b)
        if lr is not None:
            logs.setdefault(sku, []).append(lr)
        rows.append({"sku": clip(sku, CELL_MAX), "shape": clip(shape, CELL_MAX), "unit": clip(unit, 20), "gpus": int(n),
                     "measured": m, "baseline": b, "ratio": None if lr is None else _exp(lr)})  # fmt: skip
    for sku, lrs in sorted(logs.items()):
        rows.append({"sku": clip(sku, CELL_MAX), "shape": "geomean", "unit": "", "gpus": None, "measured": None,
                     "baseline": None, "ratio": geomean_ratio(lrs), "shapes": len(lrs)})  # fmt: skip
    return rows


def kind_order(kind: str) -> int:
    """Most severe first: failures, then errors and skips, then expiry, drift, faults."""
    for rank, prefix in enumerate(("fail", "not_certified", "error", "inconclusive", "required", "expired", "drifted")):
        if kind.startswith(prefix):
            return rank
    return 7


def kind_rows(stored: list[tuple[str, int]], expired: int, drifted: int, limit: int) -> list[dict[str, Any]]:
    kinds = [(k, int(n)) for k, n in stored] + [(k, n) for k, n in (("expired", expired), ("drifted", drifted)) if n]
    kinds.sort(key=lambda kn: (kind_order(kn[0]), -kn[1], kn[0]))
    rows = [{"kind": clip(k, CELL_MAX), "nodes": n} for k, n in kinds[:limit]]
    if len(kinds) > limit:
        rows.append({"kind": f"… {len(kinds) - limit} more kinds", "nodes": sum(n for _, n in kinds[limit:])})
    return rows


def drift_line(gpu: str, shape: str, unit: str, last: float, median: float, n: int, tolerance: float) -> str:
    worse = worse_by(last, median, unit)
    return (f"drifted: GPU {clip(gpu, 60)} {clip(shape, 60)}: actual {last:.4g} {unit}, own median {median:.4g} {unit} "
            f"over {n} earlier runs ({worse:+.1%} worse, tolerance {tolerance:.0%})")  # fmt: skip


def problem_lines(cert: dict[str, Any], expired: bool, now: str, stored: list[tuple], total: int,
                  drifts: list[str]) -> list[str]:  # fmt: skip
    lines = []
    if expired:
        lines.append(f"expired: expires_at {cert['expires_at']}, now {now}")
    lines += [
        clip(f"{kind}{f' (GPU {gpu})' if gpu is not None else ''}: {detail}", CELL_MAX) for kind, gpu, detail in stored
    ]
    lines += drifts
    hidden = total - len(stored) + max(len(lines) - PROBLEMS_MAX, 0)
    return lines[:PROBLEMS_MAX] + ([f"… and {hidden} more"] if hidden > 0 else [])


# ---------------------------------------------------------------------------------------------
# The report from the store


def parse_since(text: str | None) -> datetime | None:
    if text is None:
        return None
    t = parse_stamp(text if "T" in text or len(text) > 10 else f"{text}T00:00:00Z")
    if t is None:
        raise UsageError(
            f"--since must be an ISO 8601 date or time with a zone (2026-05-01, 2026-05-01T12:00:00Z), got {text!r}"
        )
    return t


def build_report(store: Store, now: datetime, since: datetime | None = None, tolerance: float = DEFAULT_TOLERANCE,
                 limit: int = DEFAULT_LIMIT, offset: int = 0) -> FleetReport:  # fmt: skip
    db, lo, t = store.db, stamp(since) if since else "", stamp(now)
    rep = FleetReport(generated_at=t, since=stamp(since) if since else None, limit=limit, offset=offset)
    rep.certificates = queries.count_certificates(db, lo)
    counts = queries.summary(db, lo, t, stamp(now + EXPIRING_WITHIN))
    rep.summary, rep.nodes = summary_rows(counts, queries.facts(db, lo)), sum(int(c[1]) for c in counts)
    rep.perf = perf_rows(queries.medians(db, lo))
    page = queries.flagged(db, lo, t, tolerance, limit, offset)
    expired = drifted = 0
    if page:
        rep.problem_nodes, expired, drifted = (int(x or 0) for x in page[0][-3:])
    elif offset:  # a page past the end still says how many there are
        whole = queries.flagged(db, lo, t, tolerance, 1, 0)
        rep.problem_nodes, expired, drifted = (int(x or 0) for x in whole[0][-3:]) if whole else (0, 0, 0)
    rep.kinds = kind_rows(queries.problem_kinds(db, lo), expired, drifted, limit)
    rep.problems = _problem_page(db, page, lo, t, tolerance)
    rep.left_out = store.left_out()
    return rep


def _problem_page(db: Any, page: list[tuple], since: str, now: str, tolerance: float) -> list[dict[str, Any]]:
    certs = [dict(zip(queries.CERT_FIELDS, row)) | {"drifted": row[-5], "severity": row[-4]} for row in page]
    stored: dict[int, list[tuple]] = {}
    totals: dict[int, int] = {}
    for cert_id, kind, gpu, detail, n in queries.problem_rows(db, [c["id"] for c in certs], PROBLEMS_MAX):
        stored.setdefault(cert_id, []).append((kind, gpu, detail))
        totals[cert_id] = int(n)
    drifts: dict[str, list[str]] = {}
    for node, gpu, shape, unit, last, median, n in queries.drift_rows(
        db, since, tolerance, [c["node"] for c in certs if c["drifted"]]
    ):
        drifts.setdefault(node, []).append(drift_line(gpu, shape, unit, last, median, int(n), tolerance))
    out = []
    for c in certs:
        lines = problem_lines(
            c, c["expires_at"] <= now, now, stored.get(c["id"], []), totals.get(c["id"], 0), drifts.get(c["node"], [])
        )
        out.append({"node": clip(c["node"], CELL_MAX), "sku": clip(c["sku"], CELL_MAX), "verdict": c["verdict"],
                    "severity": SEVERITY[c["severity"]], "issued_at": c["issued_at"], "expires_at": c["expires_at"],
                    "problems": lines})  # fmt: skip
    return out


def report_command(settings: Any, db: Any = None, fmt: str = "table", since: str | None = None,
                   tolerance: float = DEFAULT_TOLERANCE, now: Any = None, limit: int = DEFAULT_LIMIT,
                   offset: int = 0) -> FleetReport:  # fmt: skip
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not 0 <= tolerance < 1:
        raise UsageError(f"--tolerance must be at least 0 and below 1, got {tolerance:g}")
    if not 1 <= limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be 1 to {MAX_LIMIT}, got {limit}")
    if offset < 0:
        raise UsageError(f"--offset must be 0 or more, got {offset}")
    start = parse_since(since)
    with Store(db_target(settings, db), create=False) as store:
        report = build_report(store, (now or now_utc)(), start, tolerance, limit, offset)
    report.fmt = fmt
    return report
