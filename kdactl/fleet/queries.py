"""The fleet report's SQL, one statement per section, the same for SQLite and PostgreSQL.

Every statement starts from ``LATEST``: each node's latest full certificate issued at or after the
``since`` bound (its latest of any scope when it has no full one). Medians are the middle row, or the
mean of the two middle rows, of a window ordered by value (values are within extract.PLAUSIBLE, so
no arithmetic here under- or overflows). Drift compares each measurement of a node's
latest certificate with the median of the same GPU's and shape's earlier ones (worse: higher in the
time units, lower in the others).
Nothing here reads a stored document. ``latest l CROSS JOIN perf p WHERE p.cert_id = l.id`` makes
SQLite look up each latest certificate's rows by index rather than visit every perf row in another
index's order (at 100,000 certificates: seconds, not minutes); PostgreSQL plans it as a join.
"""

from __future__ import annotations

from typing import Any

from kdactl.fleet.db import Db

LOWER_IS_BETTER = ("ms", "us", "s", "ns")
MIN_HISTORY = 2  # earlier measurements needed before drift is judged
CERT_FIELDS = ("id", "node", "sku", "verdict", "scope", "issued_at", "expires_at", "reason", "fault")

LATEST_ORDER = "CASE WHEN scope = 'full' THEN 0 ELSE 1 END, issued_at DESC, id DESC"  # first: a node's latest
LATEST = f"""latest AS (
    SELECT id, node, sku, verdict, scope, issued_at, expires_at, reason, fault, cc, sm_count, target, cuda,
           suite_passed, suite_total, sanitizer_runs, sanitizer_errors
    FROM (SELECT c.*, ROW_NUMBER() OVER (PARTITION BY node ORDER BY {LATEST_ORDER}) AS rn
          FROM certs c WHERE issued_at >= ?) ranked
    WHERE rn = 1)"""  # params: since

# The mean of the one or two middle values, halved first: AVG would overflow on PostgreSQL, which sums squares.
MIDDLE = "MIN({v}) / 2 + MAX({v}) / 2"
_UNITS = ", ".join(f"'{u}'" for u in LOWER_IS_BETTER)
DRIFTED = f"""last AS (
    SELECT p.series, p.node, p.gpu, p.shape, p.unit, p.measured, l.id AS cert_id, l.issued_at
    FROM latest l CROSS JOIN perf p WHERE p.cert_id = l.id {{nodes}}),
earlier AS (
    SELECT p.series, p.measured, ROW_NUMBER() OVER (PARTITION BY p.series ORDER BY p.measured) AS k,
           COUNT(*) OVER (PARTITION BY p.series) AS n
    FROM perf p JOIN latest l ON p.node = l.node
    WHERE p.issued_at >= ? AND p.issued_at < l.issued_at AND p.cert_id <> l.id {{nodes}}),
history AS (
    SELECT series, n, {MIDDLE.format(v="measured")} AS median FROM earlier
    WHERE k IN ((n + 1) / 2, (n + 2) / 2) AND n >= {MIN_HISTORY} GROUP BY series, n),
drifted AS (
    SELECT s.node, s.gpu, s.shape, s.unit, s.measured AS last, h.median, h.n
    FROM last s JOIN history h ON h.series = s.series
    WHERE CASE WHEN s.unit IN ({_UNITS}) THEN s.measured > h.median * (1 + ?) ELSE s.measured < h.median * (1 - ?) END)"""
# params: since (of LATEST), [nodes], since, [nodes], tol, tol


def _drifted(nodes: int = 0) -> str:
    return DRIFTED.replace("{nodes}", f"AND p.node IN ({', '.join('?' * nodes)})" if nodes else "")


def count_certificates(db: Db, since: str) -> int:
    return int(db.rows("SELECT COUNT(*) FROM certs WHERE issued_at >= ?", (since,))[0][0])


def summary(db: Db, since: str, now: str, soon: str) -> list[tuple]:
    """Per SKU: nodes, certified, not certified, inconclusive, expired (said certified, lapsed), expiring
    before ``soon``, suite passed, suite total, sanitizer runs, sanitizer failures."""
    return db.rows(f"""WITH {LATEST}
        SELECT sku, COUNT(*),
               SUM(CASE WHEN verdict = 'certified' AND expires_at > ? THEN 1 ELSE 0 END),
               SUM(CASE WHEN verdict = 'not_certified' THEN 1 ELSE 0 END),
               SUM(CASE WHEN verdict = 'inconclusive' THEN 1 ELSE 0 END),
               SUM(CASE WHEN verdict = 'certified' AND expires_at <= ? THEN 1 ELSE 0 END),
               SUM(CASE WHEN verdict = 'certified' AND expires_at > ? AND expires_at <= ? THEN 1 ELSE 0 END),
               SUM(suite_passed), SUM(suite_total), SUM(sanitizer_runs), SUM(sanitizer_errors)
        FROM latest GROUP BY sku ORDER BY sku""", (since, now, now, now, soon))  # fmt: skip


def facts(db: Db, since: str) -> list[tuple]:
    """The distinct (SKU, CC, SMs, target, CUDA) of the latest certificates."""
    return db.rows(f"WITH {LATEST} SELECT DISTINCT sku, cc, sm_count, target, cuda FROM latest", (since,))


def medians(db: Db, since: str) -> list[tuple]:
    """(sku, shape, unit, GPUs, median measured, median baseline or None) over the latest
    certificates' perf rows; baselines are ranked with the missing ones last."""
    mid = "k{c} IN ((n{c} + 1) / 2, (n{c} + 2) / 2)"
    middle = {c: f"MIN(CASE WHEN {mid.format(c=c[0])} THEN {c} END) / 2 + MAX(CASE WHEN {mid.format(c=c[0])} THEN {c} END) / 2"
              for c in ("measured", "baseline")}  # fmt: skip
    return db.rows(f"""WITH {LATEST},
        ranked AS (
            SELECT p.sku, p.shape, p.unit, p.measured, p.baseline,
                   ROW_NUMBER() OVER (PARTITION BY p.sku, p.shape, p.unit ORDER BY p.measured) AS km,
                   ROW_NUMBER() OVER (PARTITION BY p.sku, p.shape, p.unit
                                      ORDER BY CASE WHEN p.baseline IS NULL THEN 1 ELSE 0 END, p.baseline) AS kb,
                   COUNT(*) OVER (PARTITION BY p.sku, p.shape, p.unit) AS nm,
                   COUNT(p.baseline) OVER (PARTITION BY p.sku, p.shape, p.unit) AS nb
            FROM latest l CROSS JOIN perf p WHERE p.cert_id = l.id)
        SELECT sku, shape, unit, nm, {middle["measured"]}, {middle["baseline"]}
        FROM ranked GROUP BY sku, shape, unit, nm ORDER BY sku, shape, unit""", (since,))  # fmt: skip


def problem_kinds(db: Db, since: str) -> list[tuple[str, int]]:
    """(kind, nodes whose latest certificate has it) from the stored problem rows."""
    return db.rows(f"""WITH {LATEST}
        SELECT p.kind, COUNT(DISTINCT l.node) FROM latest l CROSS JOIN problems p WHERE p.cert_id = l.id GROUP BY p.kind""",
                   (since,))  # fmt: skip


def flagged(db: Db, since: str, now: str, tolerance: float, limit: int, offset: int) -> list[tuple]:
    """A page of the nodes whose latest certificate is not certified, has expired, carries a fault or
    drifted, most severe first: CERT_FIELDS, drifted series, severity, then over all flagged nodes
    (not only the page): their count, how many expired, how many drifted."""
    fields = ", ".join(f"l.{f}" for f in CERT_FIELDS)
    return db.rows(f"""WITH {LATEST}, {_drifted()},
        drifted_nodes AS (SELECT node, COUNT(*) AS series FROM drifted GROUP BY node),
        flagged AS (
            SELECT {fields}, d.series,
                   CASE WHEN l.verdict = 'not_certified' THEN 0 WHEN l.verdict = 'inconclusive' THEN 1
                        WHEN l.expires_at <= ? THEN 2 WHEN d.series IS NOT NULL THEN 3 ELSE 4 END AS severity,
                   CASE WHEN l.expires_at <= ? THEN 1 ELSE 0 END AS expired
            FROM latest l LEFT JOIN drifted_nodes d ON d.node = l.node
            WHERE l.verdict <> 'certified' OR l.expires_at <= ? OR d.series IS NOT NULL OR l.fault IS NOT NULL)
        SELECT {', '.join(CERT_FIELDS)}, series, severity, COUNT(*) OVER (), SUM(expired) OVER (),
               COUNT(series) OVER ()
        FROM flagged ORDER BY severity, node LIMIT ? OFFSET ?""",
                   (since, since, tolerance, tolerance, now, now, now, limit, offset))  # fmt: skip


def problem_rows(db: Db, cert_ids: list[int], per_cert: int) -> list[tuple]:
    """(cert_id, kind, gpu, detail, problems of that certificate) for the first ``per_cert`` of each."""
    if not cert_ids:
        return []
    return db.rows(f"""SELECT cert_id, kind, gpu, detail, n FROM (
            SELECT cert_id, kind, gpu, detail, ROW_NUMBER() OVER (PARTITION BY cert_id ORDER BY kind, gpu) AS k,
                   COUNT(*) OVER (PARTITION BY cert_id) AS n
            FROM problems WHERE cert_id IN ({', '.join('?' * len(cert_ids))})) numbered
        WHERE k <= ? ORDER BY cert_id, k""", (*cert_ids, per_cert))  # fmt: skip


def drift_rows(db: Db, since: str, tolerance: float, nodes: list[str]) -> list[tuple[Any, ...]]:
    """(node, gpu, shape, unit, last, median, earlier runs) of the drifted series of ``nodes``."""
    if not nodes:
        return []
    return db.rows(f"WITH {LATEST}, {_drifted(len(nodes))} SELECT node, gpu, shape, unit, last, median, n FROM drifted "
                   "ORDER BY node, gpu, shape, unit", (since, *nodes, since, *nodes, tolerance, tolerance))  # fmt: skip
