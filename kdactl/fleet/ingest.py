"""``kdactl fleet ingest``: certificates from many nodes into the fleet store.

Each certificate is checked as ``kdactl verify`` checks it (schema, digest, HMAC signature when a
key is configured, node signature by a key of its own host when trusted keys are); a changed, corrupt, wrongly signed or malformed one is rejected with its reason and the
rest are still stored, each in a transaction of its own. Only a failure of the store itself (disk
full, server gone) stops the batch, naming the file and what was stored before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from kdactl.certify import certificate as cm
from kdactl.certify.signing import TrustedKeys, read_trusted_keys
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS, UsageError
from kdactl.fleet.extract import Unstorable
from kdactl.fleet.store import Store, db_target
from kdactl.settings import Settings


@dataclass
class IngestReport:
    db: str
    added: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    total: int | None = 0
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
            console.print(
                f"STOPPED: {self.stopped}; stored before it: {', '.join(self.added) or 'nothing'}", markup=False
            )
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


def check_for_ingest(path: Path, key: bytes | None, now: datetime,
                     trusted: TrustedKeys | None = None) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
    """(document, "") when intact, else (None, why). Expired is not a reason to reject."""
    try:
        doc, why = cm.read_certificate(path)
    except cm.CertUnreadable as err:
        return None, str(err)
    if doc is None:
        return None, why
    try:
        found = cm.check_certificate(doc, key, now, trusted)
    except cm.KeyRequired as err:
        return None, str(err)
    failures = [f for f in found.failures if not f.startswith("expired:")]
    return (None, "; ".join(failures)) if failures else (doc, "")


def ingest_command(settings: Settings, paths: list[Path], db: str | Path | None = None, key_file: Path | None = None,
                   now: Callable[[], datetime] = cm.now_utc, trusted_keys: Path | None = None) -> IngestReport:  # fmt: skip
    key = cm.read_key(settings.env, key_file)
    trusted = read_trusted_keys(settings.env, trusted_keys)
    files = expand(paths)
    t = now()
    with Store(db_target(settings, db)) as store:
        report = IngestReport(store.db.name)
        for i, path in enumerate(files):
            try:
                doc, why = check_for_ingest(path, key, t, trusted)
                if doc is None:
                    report.rejected.append((str(path), why))
                    continue
                added = store.add(doc, str(path), t)
            except store.errors as err:  # disk full, server gone: what is stored stays stored
                report.stopped = f"the store failed at {path} ({str(err).strip()}); {len(files) - i} files not ingested"
                break
            except Unstorable as err:
                report.rejected.append((str(path), f"cannot be stored: {err}"))
                continue
            except Exception as err:  # noqa: BLE001 - one document must never cost the batch the rest
                report.rejected.append((str(path), f"could not be checked: {type(err).__name__}: {err}"))
                continue
            (report.added if added else report.already).append(str(path))
        report.total = _count(store)
    return report


def _count(store: Store) -> int | None:
    try:
        return store.count()
    except store.errors:
        return None
