"""What the fleet store keeps of a certificate beside the document: the columns the report reads.

Pure functions of the document. Everything is extracted once, at ingest, as plain typed values
(bounded text, finite floats, integers), so that the report runs in SQL and never parses a stored
document, and no stored value can make it fail. A document lacking what the store keys on (digest,
hostname, verdict, times) raises ``Unstorable`` naming the field; anything else odd is kept as text.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdactl.certify.certificate import VERDICTS, parse_stamp, stamp
from kdactl.certify.schema import kind
from kdactl.fleet.text import clip

NO_GPU = "(no GPU)"
NAME_MAX = 120  # hostname, SKU, shape, check name, GPU uuid
VALUE_MAX = 200  # joined CC / SM / target / CUDA values of one node
DETAIL_MAX = 300  # one problem's message
REASON_MAX = 1000  # the verdict's reason
# A measurement or baseline outside this range is no perf value in any unit (ms, TFLOPS); keeping them
# out lets SQL do arithmetic on the rest with neither overflow nor underflow (PostgreSQL raises on both).
PLAUSIBLE = (1e-100, 1e100)


class Unstorable(ValueError):
    """The document lacks a field the store keys on; the message names it."""


@dataclass(frozen=True)
class Extracted:
    cert: dict[str, Any]  # column -> value of the certs table (without source, ingested_at, doc)
    perf: list[tuple[int, str, str, str, str, float, float | None]]  # series, gpu, sku, shape, unit, measured, baseline
    problems: list[tuple[str, str | None, str]]  # kind, gpu, detail


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    """A float, else None (a bool, a string or an int beyond the float range is no number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def plausible(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and PLAUSIBLE[0] <= x <= PLAUSIBLE[1]


def _string(doc: Mapping[str, Any], path: str) -> str:
    value: Any = doc
    for part in path.split("."):
        value = _dict(value).get(part)
    if not isinstance(value, str) or not value.strip():
        raise Unstorable(
            f"{path} is {kind(value) if not isinstance(value, str) else 'empty'}, expected a non-empty string"
        )
    return value


def _time(doc: Mapping[str, Any], name: str) -> str:
    t = parse_stamp(doc.get(name))
    if t is None:
        raise Unstorable(f"{name} {clip(doc.get(name), 40)!r} is not an ISO 8601 time with a zone")
    return stamp(t)


def _gpu_key(g: Mapping[str, Any], fallback: Any) -> str:
    """The GPU a perf series belongs to: its uuid, else its index."""
    uuid = g.get("uuid")
    return clip(uuid if isinstance(uuid, str) and uuid else fallback, NAME_MAX)


def _joined(values: list[Any]) -> str:
    return clip(", ".join(sorted({clip(v, NAME_MAX) for v in values if v is not None})) or "-", VALUE_MAX)


def extract(doc: Mapping[str, Any]) -> Extracted:
    digest = _string(doc, "integrity.sha256")
    host = _string(doc, "node.hostname")
    verdict = doc.get("verdict")
    if verdict not in VERDICTS:
        raise Unstorable(f"verdict {clip(verdict, 40)!r} is not one of {', '.join(VERDICTS)}")
    gpus = [g for g in _list(doc.get("gpus")) if isinstance(g, dict)]
    by_index = {g["index"]: g for g in gpus if isinstance(g.get("index"), int) and not isinstance(g.get("index"), bool)}
    sku = clip("+".join(sorted({clip(g.get("sku"), NAME_MAX) for g in gpus})) or NO_GPU, NAME_MAX)
    results: list[Mapping[str, Any]] = [r for r in _list(doc.get("results")) if isinstance(r, dict)]
    fault = _dict(doc.get("options")).get("fault")
    cert = {
        "digest": clip(digest, 64), "node": clip(host, NAME_MAX), "sku": sku, "verdict": verdict,
        "scope": clip(doc.get("scope") or "full", 20), "issued_at": _time(doc, "issued_at"),
        "expires_at": _time(doc, "expires_at"), "reason": clip(doc.get("reason") or "", REASON_MAX),
        "fault": clip(fault, NAME_MAX) if fault else None, "gpus": len(gpus),
        "cc": _joined([g.get("cc") for g in gpus]), "sm_count": _joined([g.get("sm_count") for g in gpus]),
        "target": _joined([g.get("target") for g in gpus]), "cuda": _joined([_dict(doc.get("versions")).get("cuda_toolkit")]),
        **_counts(results),
    }  # fmt: skip
    return Extracted(cert, _perf(results, by_index, sku, cert["node"]), _problems(results, cert))


def _check(r: Mapping[str, Any]) -> str:
    return r["check"] if isinstance(r.get("check"), str) else clip(r.get("check"), NAME_MAX)


def is_sanitizer(check: str) -> bool:
    return check.startswith("sanitize")


def is_perf(check: str) -> bool:
    return check.startswith("perf")


def _counts(results: list[Mapping[str, Any]]) -> dict[str, int]:
    suite = [r for r in results if not is_sanitizer(_check(r)) and not is_perf(_check(r))]
    sanitizer = [r for r in results if is_sanitizer(_check(r))]
    return {"suite_passed": sum(r.get("status") == "pass" for r in suite), "suite_total": len(suite),
            "sanitizer_runs": len(sanitizer), "sanitizer_errors": sum(r.get("status") == "fail" for r in sanitizer)}  # fmt: skip


def series_key(*parts: str) -> int:
    """One signed 64-bit integer per (node, GPU, shape, unit): drift sorts by it, not by four strings."""
    return int.from_bytes(hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest(), "big", signed=True)


def _perf(
    results: list[Mapping[str, Any]], by_index: Mapping[int, Mapping[str, Any]], node_sku: str, node: str
) -> list[tuple]:
    """The perf results with a plausible measurement (a baseline out of range counts as none)."""
    out = []
    for r in results:
        measured = _number(r.get("measured"))
        if not is_perf(_check(r)) or not plausible(measured):
            continue
        gpu = r.get("gpu")
        g = by_index.get(gpu) if isinstance(gpu, int) and not isinstance(gpu, bool) else None
        sku = clip(g.get("sku"), NAME_MAX) if g else node_sku
        key, shape, unit = (
            _gpu_key(g or {}, gpu),
            clip(r.get("shape") or _check(r), NAME_MAX),
            clip(r.get("unit") or "", 20),
        )
        baseline = _number(r.get("baseline"))
        out.append(
            (
                series_key(node, key, shape, unit),
                key,
                sku,
                shape,
                unit,
                measured,
                baseline if plausible(baseline) else None,
            )
        )
    return out


def _problems(results: list[Mapping[str, Any]], cert: Mapping[str, Any]) -> list[tuple[str, str | None, str]]:
    """One row per failed, errored or skipped-but-required check, per perf value out of range, and one
    for an injected fault; a verdict other than certified with none of these still gets a row, so
    that no such node goes unnamed."""
    out = []
    for r in results:
        if is_perf(_check(r)):
            bad = {
                k: r[k]
                for k in ("measured", "baseline")
                if (x := _number(r.get(k))) is not None and x > 0 and not plausible(x)
            }
            if bad:
                out.append((f"perf value out of range: {clip(_check(r), NAME_MAX)}", None if r.get("gpu") is None else clip(r.get("gpu"), NAME_MAX),
                            clip(", ".join(f"{k} {v!r}" for k, v in bad.items()), DETAIL_MAX)))  # fmt: skip
        status = r.get("status")
        if status in ("fail", "error") or (status == "skip" and r.get("required", True) is True):
            what = f"{'required check skipped' if status == 'skip' else status}: {clip(_check(r), NAME_MAX)}"
            gpu = r.get("gpu")
            out.append(
                (what, None if gpu is None else clip(gpu, NAME_MAX), clip(r.get("message") or status, DETAIL_MAX))
            )
    if cert["fault"]:
        out.append(("fault injected", None, f"KDACTL_FAULT={cert['fault']}: a test of the pipeline, not of the node"))
    if cert["verdict"] != "certified" and not out:
        out.append(
            (
                f"{cert['verdict']}: no failing check named",
                None,
                clip(cert["reason"] or "no reason recorded", DETAIL_MAX),
            )
        )
    return out
