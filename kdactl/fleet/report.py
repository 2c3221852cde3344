"""``kdactl fleet report``: what the stored certificates say about the fleet, per SKU.

Pure functions of the certificate documents and the time now:
  qualification  one row per SKU over each node's latest certificate: CC, SMs, CUDA toolkit, target,
                 suite checks passed/total, sanitizer failures, nodes certified/total;
  perf           per SKU and shape: median measured over the nodes' GPUs against the baseline, and
                 the geomean of measured/baseline per SKU;
  problems       the nodes whose latest certificate is not ``certified``, has expired, or whose
                 perf drifted: the latest measurement worse than the median of that GPU's own
                 earlier ones by more than the tolerance.
A node counts as certified only when its latest certificate says so and has not expired: missing
evidence is never a pass, so a SKU whose nodes ran no sanitizer says "not run", not 0 errors.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from kdactl.certify.certificate import parse_stamp, stamp

NO_GPU = "(no GPU)"
LOWER_IS_BETTER = {"ms", "us", "s", "ns"}
DEFAULT_TOLERANCE = 0.10
MIN_HISTORY = 2  # earlier measurements needed before drift is judged

Doc = Mapping[str, Any]


@dataclass
class FleetReport:
    generated_at: str
    since: str | None
    certificates: int
    qualification: list[dict[str, Any]] = field(default_factory=list)
    perf: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    nodes: int = 0
    left_out: list[str] = field(default_factory=list)  # stored rows that are not well-formed certificates
    fmt: str = "table"
    exit_code: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"command": "fleet report", "generated_at": self.generated_at, "since": self.since,
                "certificates": self.certificates, "nodes": self.nodes, "qualification": self.qualification,
                "perf": self.perf, "problems": self.problems, "left_out": self.left_out,
                "exit_code": self.exit_code}  # fmt: skip

    def render(self, console: Any) -> None:
        from kdactl.fleet import render

        render.render(self, console, self.fmt)


# ---------------------------------------------------------------------------------------------
# Node and GPU facts from a certificate


def _host(doc: Doc) -> str:
    return str((doc.get("node") or {}).get("hostname") or "?")


def node_sku(doc: Doc) -> str:
    skus = sorted({str(g.get("sku")) for g in doc.get("gpus") or []})
    return "+".join(skus) if skus else NO_GPU


def _gpu_by_index(doc: Doc) -> dict[Any, Mapping[str, Any]]:
    return {g.get("index"): g for g in doc.get("gpus") or []}


def _result_sku(doc: Doc, r: Mapping[str, Any]) -> str:
    g = _gpu_by_index(doc).get(r.get("gpu"))
    return str(g.get("sku")) if g else node_sku(doc)


def latest_per_node(docs: Iterable[Doc]) -> dict[str, Doc]:
    """Each node's latest full certificate, or its latest of any scope when it has no full one."""
    out: dict[str, Doc] = {}
    for doc in sorted(docs, key=lambda d: (d.get("scope") == "full", str(d.get("issued_at")))):
        out[_host(doc)] = doc
    return out


def expired(doc: Doc, now: datetime) -> bool:
    t = parse_stamp(doc.get("expires_at"))
    return t is None or t <= now


def is_sanitizer(check: str) -> bool:
    return check.startswith("sanitize")


def is_perf(r: Mapping[str, Any]) -> bool:
    return str(r.get("check", "")).startswith("perf")


# ---------------------------------------------------------------------------------------------
# Qualification


def qualification(latest: Mapping[str, Doc], now: datetime) -> list[dict[str, Any]]:
    by_sku: dict[str, list[Doc]] = {}
    for doc in latest.values():
        by_sku.setdefault(node_sku(doc), []).append(doc)
    return [_qual_row(sku, docs, now) for sku, docs in sorted(by_sku.items())]


def _qual_row(sku: str, docs: list[Doc], now: datetime) -> dict[str, Any]:
    gpus = [g for d in docs for g in d.get("gpus") or []]
    results = [r for d in docs for r in d.get("results") or []]
    suite = [r for r in results if not is_sanitizer(str(r.get("check"))) and not is_perf(r)]
    sanitizer = [r for r in results if is_sanitizer(str(r.get("check")))]
    certified = [d for d in docs if d.get("verdict") == "certified" and not expired(d, now)]
    return {
        "sku": sku,
        "cc": _joined(g.get("cc") for g in gpus),
        "sm_count": _joined(g.get("sm_count") for g in gpus),
        "cuda": _joined((d.get("versions") or {}).get("cuda_toolkit") for d in docs),
        "target": _joined(g.get("target") for g in gpus),
        "suite_passed": sum(r.get("status") == "pass" for r in suite),
        "suite_total": len(suite),
        "sanitizer_runs": len(sanitizer),
        "sanitizer_errors": sum(r.get("status") == "fail" for r in sanitizer) if sanitizer else None,
        "nodes_certified": len(certified),
        "nodes_total": len(docs),
    }


def _joined(values: Iterable[Any]) -> str:
    seen = sorted({str(v) for v in values if v is not None})
    return ", ".join(seen) if seen else "-"


# ---------------------------------------------------------------------------------------------
# Performance


def perf_points(doc: Doc) -> list[dict[str, Any]]:
    """Each perf result with a numeric measurement: sku, gpu (uuid), shape, unit, measured, baseline."""
    gpus = _gpu_by_index(doc)
    out = []
    for r in doc.get("results") or []:
        m = r.get("measured")
        if not isinstance(m, (int, float)) or isinstance(m, bool) or not math.isfinite(m) or m <= 0:
            continue
        b = r.get("baseline")
        g = gpus.get(r.get("gpu")) or {}
        out.append({"sku": _result_sku(doc, r), "gpu": g.get("uuid") or r.get("gpu"), "shape": str(r.get("shape") or r.get("check")),
                    "unit": str(r.get("unit") or ""), "measured": float(m),
                    "baseline": float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 else None})  # fmt: skip
    return out


def perf_table(latest: Mapping[str, Doc]) -> list[dict[str, Any]]:
    """Rows per (SKU, shape, unit), then one geomean row per SKU (over shapes with a baseline)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for doc in latest.values():
        for p in perf_points(doc):
            groups.setdefault((p["sku"], p["shape"], p["unit"]), []).append(p)
    rows, ratios = [], {}
    for (sku, shape, unit), pts in sorted(groups.items()):
        measured = statistics.median(p["measured"] for p in pts)
        baselines = [p["baseline"] for p in pts if p["baseline"]]
        baseline = statistics.median(baselines) if baselines else None
        ratio = measured / baseline if baseline else None
        if ratio is not None:
            ratios.setdefault(sku, []).append(ratio)
        rows.append({"sku": sku, "shape": shape, "unit": unit, "gpus": len(pts), "measured": measured,
                     "baseline": baseline, "ratio": ratio})  # fmt: skip
    for sku, rs in sorted(ratios.items()):
        rows.append({"sku": sku, "shape": "geomean", "unit": "", "gpus": None, "measured": None, "baseline": None,
                     "ratio": geomean(rs), "shapes": len(rs)})  # fmt: skip
    return rows


def geomean(values: Iterable[float]) -> float:
    vs = list(values)
    return math.exp(sum(math.log(v) for v in vs) / len(vs))


def drift(docs: Iterable[Doc], tolerance: float = DEFAULT_TOLERANCE) -> dict[str, list[str]]:
    """hostname -> one line per (GPU, shape) whose latest measurement is worse than the median of
    that series' earlier ones by more than ``tolerance`` (time units: slower; others: lower)."""
    series: dict[tuple[str, Any, str, str], list[tuple[str, float]]] = {}
    for doc in docs:
        for p in perf_points(doc):
            series.setdefault((_host(doc), p["gpu"], p["shape"], p["unit"]), []).append((str(doc.get("issued_at")), p["measured"]))
    out: dict[str, list[str]] = {}
    for (host, gpu, shape, unit), pts in sorted(series.items(), key=lambda kv: str(kv[0])):
        pts.sort()
        if len(pts) < MIN_HISTORY + 1:
            continue
        last, median = pts[-1][1], statistics.median(v for _, v in pts[:-1])
        worse = last / median - 1 if unit in LOWER_IS_BETTER else 1 - last / median
        if worse > tolerance:
            out.setdefault(host, []).append(
                f"GPU {gpu} {shape}: actual {last:.4g} {unit}, own median {median:.4g} {unit} over {len(pts) - 1} "
                f"earlier runs ({worse:+.1%} worse, tolerance {tolerance:.0%})")
    return out


# ---------------------------------------------------------------------------------------------
# Problem nodes and the whole report


def problems(latest: Mapping[str, Doc], drifted: Mapping[str, list[str]], now: datetime) -> list[dict[str, Any]]:
    out = []
    for host, doc in sorted(latest.items()):
        found = []
        if doc.get("verdict") != "certified":
            found.append(f"{doc.get('verdict')}: {doc.get('reason') or 'no reason recorded'}")
        if expired(doc, now):
            found.append(f"expired: expires_at {doc.get('expires_at')}, now {stamp(now)}")
        fault = (doc.get("options") or {}).get("fault")
        if fault:
            found.append(f"fault injected (KDACTL_FAULT={fault}): a test of the pipeline, not of the node")
        found += [f"drifted: {line}" for line in drifted.get(host, [])]
        if found:
            out.append({"node": host, "sku": node_sku(doc), "verdict": doc.get("verdict"), "issued_at": doc.get("issued_at"),
                        "expires_at": doc.get("expires_at"), "problems": found})  # fmt: skip
    return out


def build_report(docs: list[Doc], now: datetime, since: datetime | None = None,
                 tolerance: float = DEFAULT_TOLERANCE) -> FleetReport:  # fmt: skip
    latest = latest_per_node(docs)
    return FleetReport(
        generated_at=stamp(now), since=stamp(since) if since else None, certificates=len(docs), nodes=len(latest),
        qualification=qualification(latest, now), perf=perf_table(latest),
        problems=problems(latest, drift(docs, tolerance), now),
    )


FORMATS = ("table", "markdown", "json", "html")


def parse_since(text: str | None) -> datetime | None:
    from kdactl.errors import UsageError

    if text is None:
        return None
    t = parse_stamp(text if "T" in text or len(text) > 10 else f"{text}T00:00:00Z")
    if t is None:
        raise UsageError(f"--since must be an ISO 8601 date or time with a zone (2026-05-01, 2026-05-01T12:00:00Z), got {text!r}")
    return t


def report_command(settings: Any, db: Any = None, fmt: str = "table", since: str | None = None,
                   tolerance: float = DEFAULT_TOLERANCE, now: Any = None) -> FleetReport:  # fmt: skip
    from pathlib import Path

    from kdactl.certify.certificate import now_utc
    from kdactl.errors import UsageError
    from kdactl.fleet.store import default_db, load_docs

    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not 0 <= tolerance < 1:
        raise UsageError(f"--tolerance must be at least 0 and below 1, got {tolerance:g}")
    start = parse_since(since)
    docs, left_out = load_docs(Path(db) if db else default_db(settings), start)
    report = build_report(docs, (now or now_utc)(), start, tolerance)
    report.fmt, report.left_out = fmt, left_out
    return report
