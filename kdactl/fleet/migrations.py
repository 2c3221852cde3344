"""The fleet store's schema, as numbered migrations that every opener applies once, in order.

``schema_version`` holds the numbers applied. Opening runs the missing ones in one transaction that
also serializes concurrent openers, so two ingests starting on a new store do not both create it.
A store written by kdactl before these migrations (one ``certs`` table of whole documents) is
carried over: its documents are extracted again, and the rows that are not well-formed certificates
are kept in ``left_out`` with the reason, which the report names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kdactl.fleet.db import Db

# certs: one row per distinct certificate (by digest), the report's columns extracted at ingest;
# docs: the document itself (zlib-compressed JSON), for whatever a later version needs to extract, in a
# table of its own so that scanning certs never pages through documents.
# perf: one row per perf result with a measurement; node and issued_at repeated, and series (a hash of
# node, GPU, shape and unit), so that drift needs no join and sorts integers. problems: one row per failed / errored / required-skipped check.
V1 = (
    """CREATE TABLE certs (
        id {id}, digest TEXT NOT NULL UNIQUE, node TEXT NOT NULL, sku TEXT NOT NULL, verdict TEXT NOT NULL,
        scope TEXT NOT NULL, issued_at TEXT NOT NULL, expires_at TEXT NOT NULL, reason TEXT NOT NULL, fault TEXT,
        gpus INTEGER NOT NULL, cc TEXT NOT NULL, sm_count TEXT NOT NULL, target TEXT NOT NULL, cuda TEXT NOT NULL,
        suite_passed INTEGER NOT NULL, suite_total INTEGER NOT NULL, sanitizer_runs INTEGER NOT NULL,
        sanitizer_errors INTEGER NOT NULL, source TEXT NOT NULL, ingested_at TEXT NOT NULL)""",
    "CREATE TABLE docs (cert_id {bigint} PRIMARY KEY REFERENCES certs (id), doc {blob} NOT NULL)",
    "CREATE INDEX certs_node_time ON certs (node, issued_at)",
    "CREATE INDEX certs_issued ON certs (issued_at)",
    """CREATE TABLE perf (
        cert_id {bigint} NOT NULL REFERENCES certs (id), node TEXT NOT NULL, issued_at TEXT NOT NULL, series {bigint} NOT NULL,
        gpu TEXT NOT NULL,
        sku TEXT NOT NULL, shape TEXT NOT NULL, unit TEXT NOT NULL, measured {real} NOT NULL, baseline {real})""",
    "CREATE INDEX perf_cert ON perf (cert_id)",
    "CREATE INDEX perf_node ON perf (node, issued_at)",
    """CREATE TABLE problems (
        cert_id {bigint} NOT NULL REFERENCES certs (id), kind TEXT NOT NULL, gpu TEXT, detail TEXT NOT NULL)""",
    "CREATE INDEX problems_cert ON problems (cert_id)",
    "CREATE TABLE left_out (digest TEXT, source TEXT NOT NULL, reason TEXT NOT NULL)",
)

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = ((1, V1),)
LEGACY = "certs_before_v1"


def applied(db: Db) -> int:
    if not db.has_table("schema_version"):
        return 0
    return int(db.rows("SELECT COALESCE(MAX(version), 0) FROM schema_version")[0][0])


def migrate(db: Db, carry_legacy: Callable[[Db, str], None]) -> int:
    """Apply the missing migrations; return the version now. ``carry_legacy(db, table)`` re-stores
    the rows of a pre-migration store that was renamed to ``table``."""
    if applied(db) == MIGRATIONS[-1][0]:
        return applied(db)  # the common case, without taking the write lock
    with db.transaction():
        db.lock_for_migration()
        version = applied(db)
        legacy = version == 0 and db.has_table("certs")
        if legacy:
            db.execute(f"ALTER TABLE certs RENAME TO {LEGACY}")
            db.execute("DROP INDEX IF EXISTS certs_host_time")
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_at TEXT)")
        for number, statements in MIGRATIONS:
            if number > version:
                for statement in statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_version VALUES (?, CURRENT_TIMESTAMP)", (number,))
        if legacy:
            carry_legacy(db, LEGACY)
            db.execute(f"DROP TABLE {LEGACY}")
        return applied(db)


def legacy_rows(db: Db, table: str) -> Any:
    return db.execute(f"SELECT digest, source, ingested_at, doc FROM {table} ORDER BY issued_at, digest")
