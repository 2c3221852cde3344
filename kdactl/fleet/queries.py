"""The fleet report's SQL, one statement per section, the same for SQLite and PostgreSQL.

Every statement starts from ``LATEST``: each node's latest full certificate issued at or after the
``since`` bound (its latest of any scope when it has no full one). Medians are the middle row, or the
mean of the two middle rows, of a window ordered by value (values are within extract.PLAUSIBLE, so
no arithmetic here under- or overflows). Drift compares each GPU series' latest
measurement with the median of its earlier ones, in the time units (lower is better) or others.
Nothing here reads a stored document.
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
DRIFTED = f"""series AS (
    SELECT node, gpu, shape, unit, measured,
           ROW_NUMBER() OVER (PARTITION BY node, gpu, shape, unit ORDER BY issued_at DESC, cert_id DESC) AS age
    FROM perf WHERE issued_at >= ? {{nodes}}),
earlier AS (
    SELECT node, gpu, shape, unit, measured,
           ROW_NUMBER() OVER (PARTITION BY node, gpu, shape, unit ORDER BY measured) AS k,
           COUNT(*) OVER (PARTITION BY node, gpu, shape, unit) AS n
    FROM series WHERE age > 1),
history AS (
    SELECT node, gpu, shape, unit, n, {MIDDLE.format(v="measured")} AS median FROM earlier
    WHERE k IN ((n + 1) / 2, (n + 2) / 2) GROUP BY node, gpu, shape, unit, n),
drifted AS (
    SELECT s.node, s.gpu, s.shape, s.unit, s.measured AS last, h.median, h.n
    FROM series s JOIN history h ON h.node = s.node AND h.gpu = s.gpu AND h.shape = s.shape AND h.unit = s.unit
    WHERE s.age = 1 AND h.n >= {MIN_HISTORY} AND CASE WHEN s.unit IN ({_UNITS}) THEN s.measured > h.median * (1 + ?)
                                                       ELSE s.measured < h.median * (1 - ?) END)"""  # params: since, tol, tol


def _drifted(nodes: int = 0) -> str:
    return DRIFTED.replace("{nodes}", f"AND node IN ({', '.join('?' * nodes)})" if nodes else "")


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


def medians(db: Db, since: str, column: str) -> list[tuple]:
    """(sku, shape, unit, values, median of ``column``) over the latest certificates' perf rows."""
    assert column in ("measured", "baseline")
    return db.rows(f"""WITH {LATEST},
        pts AS (SELECT p.sku, p.shape, p.unit, p.{column} AS v FROM perf p JOIN latest l ON p.cert_id = l.id
                WHERE p.{column} IS NOT NULL),
        ranked AS (SELECT sku, shape, unit, v, ROW_NUMBER() OVER (PARTITION BY sku, shape, unit ORDER BY v) AS k,
                          COUNT(*) OVER (PARTITION BY sku, shape, unit) AS n FROM pts)
        SELECT sku, shape, unit, n, {MIDDLE.format(v="v")} FROM ranked WHERE k IN ((n + 1) / 2, (n + 2) / 2)
        GROUP BY sku, shape, unit, n ORDER BY sku, shape, unit""", (since,))  # fmt: skip


def problem_kinds(db: Db, since: str) -> list[tuple[str, int]]:
    """(kind, nodes whose latest certificate has it) from the stored problem rows."""
    return db.rows(f"""WITH {LATEST}
        SELECT p.kind, COUNT(DISTINCT l.node) FROM problems p JOIN latest l ON p.cert_id = l.id GROUP BY p.kind""",
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
    return db.rows(f"WITH {_drifted(len(nodes))} SELECT node, gpu, shape, unit, last, median, n FROM drifted "
                   "ORDER BY node, gpu, shape, unit", (since, *nodes, tolerance, tolerance))  # fmt: skip
