"""The fleet store: certificates from many nodes, in SQLite (a file) or PostgreSQL (a URL).

A certificate is keyed by its integrity digest, so storing the same one again adds nothing. Each is
stored in one transaction with the columns the report reads (kdactl.fleet.extract), its perf results
and its problems; the document itself is kept compressed. Expiry does not reject: an expired
certificate is history, and the report says it expired.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from kdactl.certify.certificate import check_schema, stamp
from kdactl.errors import UsageError
from kdactl.fleet import migrations
from kdactl.fleet.db import Db, is_url, open_db
from kdactl.fleet.extract import Extracted, Unstorable, extract
from kdactl.fleet.text import clip
from kdactl.settings import Settings

DB_ENV = "KDACTL_FLEET_DB"  # a default --db; a PostgreSQL URL kept off the command line
CERT_COLUMNS = ("digest", "node", "sku", "verdict", "scope", "issued_at", "expires_at", "reason", "fault", "gpus", "cc",
                "sm_count", "target", "cuda", "suite_passed", "suite_total", "sanitizer_runs", "sanitizer_errors")  # fmt: skip
SOURCE_MAX = 500


def default_db(settings: Settings) -> str:
    return settings.env.get(DB_ENV) or str(settings.data_dir / "fleet.db")


def db_target(settings: Settings, db: str | Path | None) -> str:
    return str(db) if db else default_db(settings)


def encode(doc: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), 6)


def decode(blob: bytes | memoryview) -> Any:
    return json.loads(zlib.decompress(bytes(blob)))


class Store:
    """An open store, migrated to the current schema."""

    def __init__(self, target: str | Path, create: bool = True):
        if not create and not is_url(target) and not Path(target).is_file():
            raise UsageError(f"--db {target}: no fleet store there (run kdactl fleet ingest first)")
        self.db: Db = open_db(target, create)
        try:
            migrations.migrate(self.db, _carry_legacy)
        except self.db.errors as err:
            self.db.close()
            raise UsageError(f"--db {self.db.name}: cannot prepare the fleet store: {str(err).strip()}") from None

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        return self.db.errors

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def add(self, doc: Mapping[str, Any], source: str, now: datetime) -> bool:
        """Store one certificate in one transaction; False when its digest is already stored.
        Unstorable when it lacks a field the store keys on."""
        found = extract(doc)
        blob = encode(doc)
        with self.db.transaction():
            return _insert(self.db, found, source, stamp(now), blob)

    def count(self) -> int:
        return int(self.db.rows("SELECT COUNT(*) FROM certs")[0][0])

    def left_out(self) -> list[str]:
        """One line per row of a pre-migration store that was not a well-formed certificate."""
        rows = self.db.rows("SELECT digest, source, reason FROM left_out ORDER BY source")
        return [
            f"stored row {clip(d or '?', 16)}... (from {clip(s, 200)}) left out: {clip(r, 300)}" for d, s, r in rows
        ]


def _insert(db: Db, found: Extracted, source: str, ingested_at: str, blob: bytes) -> bool:
    c = found.cert
    names = (*CERT_COLUMNS, "source", "ingested_at")
    values = (*(c[k] for k in CERT_COLUMNS), clip(source, SOURCE_MAX), ingested_at)
    got = db.rows(f"INSERT INTO certs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
                  "ON CONFLICT (digest) DO NOTHING RETURNING id", values)  # fmt: skip
    if not got:
        return False
    cert_id = got[0][0]
    db.execute("INSERT INTO docs VALUES (?, ?)", (cert_id, blob))
    db.many(
        "INSERT INTO perf VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(cert_id, c["node"], c["issued_at"], *p) for p in found.perf],
    )
    db.many("INSERT INTO problems VALUES (?, ?, ?, ?)", [(cert_id, *p) for p in found.problems])
    return True


def _carry_legacy(db: Db, table: str) -> None:
    for digest, source, ingested_at, text in migrations.legacy_rows(db, table).fetchall():
        try:
            doc = json.loads(text)
            problems = check_schema(doc) if isinstance(doc, dict) else ["not a JSON object"]
            if not problems:
                _insert(db, extract(doc), source, ingested_at, encode(doc))
        except (TypeError, ValueError, RecursionError) as err:  # Unstorable is a ValueError
            problems = [f"not valid JSON: {err}" if not isinstance(err, Unstorable) else str(err)]
        if problems:
            db.execute(
                "INSERT INTO left_out VALUES (?, ?, ?)",
                (clip(digest, 64), clip(source, SOURCE_MAX), clip("; ".join(problems), 1000)),
            )
