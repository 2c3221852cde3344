"""``kdactl fleet ingest``: certificates from many nodes into one SQLite store.

Each certificate is checked as ``kdactl verify`` checks it (schema, digest, signature when a key is
configured); a changed, corrupt or wrongly signed one is rejected with its reason and the rest are
still ingested. Expiry does not reject: an expired certificate is history, and the report says it
expired. A certificate is keyed by its integrity digest, so ingesting the same file again adds
nothing. The store keeps each document whole; the report reads the documents back.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

from rich.console import Console

from kdactl.certify import certificate as cm
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS, UsageError
from kdactl.settings import Settings

_SCHEMA = """
CREATE TABLE IF NOT EXISTS certs (
    digest      TEXT PRIMARY KEY,
    hostname    TEXT,
    verdict     TEXT NOT NULL,
    scope       TEXT,
    issued_at   TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    source      TEXT NOT NULL,
    ingested_at TEXT NOT NULL,
    doc         TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS certs_host_time ON certs (hostname, issued_at);
"""


def default_db(settings: Settings) -> Path:
    return settings.data_dir / "fleet.db"


class Store:
    """The fleet database: one row per distinct certificate (by digest)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path)
            self.conn.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise UsageError(f"--db {self.path}: cannot open the fleet store: {err}") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def add(self, doc: dict[str, Any], source: str, now: datetime) -> bool:
        """Insert; False when a certificate with this digest is already stored."""
        node = doc.get("node") if isinstance(doc.get("node"), dict) else {}
        row = (doc["integrity"]["sha256"], node.get("hostname"), doc["verdict"], doc.get("scope"), doc["issued_at"],
               doc["expires_at"], source, cm.stamp(now), json.dumps(doc, sort_keys=True))  # fmt: skip
        with self.conn:
            cur = self.conn.execute("INSERT OR IGNORE INTO certs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        return cur.rowcount == 1

    def documents(self, since: datetime | None = None) -> list[dict[str, Any]]:
        """Every stored certificate (issued at or after ``since``), oldest first."""
        return self.read(since)[0]

    def read(self, since: datetime | None = None) -> tuple[list[dict[str, Any]], list[str]]:
        """(documents, one line per stored row that is not a well-formed certificate). A store
        written by an older kdactl, or by hand, may hold such a row: it is left out and named, so
        one bad row never takes down the report of the whole fleet."""
        rows = self.conn.execute("SELECT digest, source, issued_at, doc FROM certs ORDER BY issued_at, digest").fetchall()
        docs, bad = [], []
        for digest, source, issued, text in rows:
            t = cm.parse_stamp(issued)
            if since is not None and (t is None or t < since):
                continue
            try:
                doc = json.loads(text)
                problems = cm.check_schema(doc) if isinstance(doc, dict) else ["not a JSON object"]
            except (TypeError, ValueError) as err:
                problems = [f"not valid JSON: {err}"]
            if problems:
                bad.append(f"stored row {str(digest)[:16]}... (from {source}) left out: {'; '.join(problems)}")
            else:
                docs.append(doc)
        return docs, bad

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM certs").fetchone()[0]


@dataclass
class IngestReport:
    db: str
    added: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    total: int = 0
    stopped: str | None = None  # the store failed part-way: why, and at which file

    @property
    def exit_code(self) -> int:
        return EXIT_INCONCLUSIVE if self.stopped else EXIT_NOT_CERTIFIED if self.rejected else EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        return {"command": "fleet ingest", "db": self.db, "exit_code": self.exit_code, "added": self.added,
                "already_stored": self.already, "rejected": [{"path": p, "reason": r} for p, r in self.rejected],
                "certificates_in_store": self.total, "stopped": self.stopped}  # fmt: skip

    def render(self, console: Console) -> None:
        for path, reason in self.rejected:
            console.print(f"REJECTED: {path}: {reason}", markup=False)
        if self.stopped:
            console.print(f"STOPPED: {self.stopped}; stored before it: {', '.join(self.added) or 'nothing'}", markup=False)
        console.print(f"{len(self.added)} added, {len(self.already)} already stored, {len(self.rejected)} rejected; "
                      f"{self.total} certificates in {self.db}", markup=False)  # fmt: skip


def expand(paths: Iterable[Path]) -> list[Path]:
    """Files as given; a directory contributes its *.json files (recursively, sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(q for q in p.rglob("*.json") if q.is_file())
        elif p.exists():
            out.append(p)
        else:
            raise UsageError(f"fleet ingest: {p} does not exist")
    if not out:
        raise UsageError(f"fleet ingest: no certificates (*.json) in {', '.join(map(str, paths)) or 'no paths given'}")
    return out


def check_for_ingest(path: Path, key: bytes | None, now: datetime) -> tuple[dict[str, Any] | None, str]:
    """(document, "") when intact, else (None, why). Expired is not a reason to reject."""
    try:
        doc, why = cm.read_certificate(path)
    except cm.CertUnreadable as err:
        return None, str(err)
    if doc is None:
        return None, why
    try:
        found = cm.check_certificate(doc, key, now)
    except cm.KeyRequired as err:
        return None, str(err)
    failures = [f for f in found.failures if not f.startswith("expired:")]
    return (None, "; ".join(failures)) if failures else (doc, "")


def ingest_command(settings: Settings, paths: list[Path], db: Path | None = None, key_file: Path | None = None,
                   now: Callable[[], datetime] = cm.now_utc) -> IngestReport:  # fmt: skip
    key = cm.read_key(settings.env, key_file)
    files = expand(paths)
    db_path = Path(db) if db else default_db(settings)
    report = IngestReport(str(db_path))
    t = now()
    with Store(db_path) as store:
        for path in files:
            doc, why = check_for_ingest(path, key, t)
            if doc is None:
                report.rejected.append((str(path), why))
                continue
            try:
                added = store.add(doc, str(path), t)
            except sqlite3.Error as err:  # disk full, locked, read-only: what is stored stays stored
                report.stopped = f"the store failed at {path} ({err}); {len(files) - len(report.added) - len(report.already) - len(report.rejected)} files not ingested"
                break
            (report.added if added else report.already).append(str(path))
        report.total = _count(store)
    return report


def _count(store: Store) -> int | None:
    try:
        return store.count()
    except sqlite3.Error:
        return None


def load_docs(db: Path, since: datetime | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """The store's well-formed certificates and a line per row left out (Store.read)."""
    if not Path(db).exists():
        raise UsageError(f"--db {db}: no fleet store there (run kdactl fleet ingest first)")
    with Store(db) as store:
        return store.read(since)
