"""``kdactl fleet prune``: retention. Removes each node's older certificates beyond the newest
``--keep N`` and/or those issued more than ``--older-than DAYS`` ago. A node's latest certificate
(the one the report reads) is always kept, so pruning never hides a node from the report; a node's
history shrinks, and with it the runs its drift is judged against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console

from kdactl.certify.certificate import now_utc, stamp
from kdactl.errors import EXIT_PASS, UsageError
from kdactl.fleet.queries import LATEST_ORDER
from kdactl.fleet.store import Store, db_target
from kdactl.settings import Settings

CHUNK = 500  # certificate ids per DELETE statement


@dataclass
class PruneReport:
    db: str
    removed: int
    kept: int
    dry_run: bool
    exit_code: int = EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        return {"command": "fleet prune", "db": self.db, "removed": self.removed, "kept": self.kept,
                "dry_run": self.dry_run, "exit_code": self.exit_code}  # fmt: skip

    def render(self, console: Console) -> None:
        verb = "would remove" if self.dry_run else "removed"
        console.print(f"{verb} {self.removed} certificates, {self.kept} kept in {self.db}", markup=False)


def doomed(store: Store, keep: int | None, before: str | None) -> list[int]:
    """Ids of the certificates to remove: rank beyond ``keep`` or issued before ``before``, never rank 1."""
    conds = [*(["rn > ?"] if keep is not None else []), *(["issued_at < ?"] if before is not None else [])]
    params = [*([keep] if keep is not None else []), *([before] if before is not None else [])]
    rows = store.db.rows(f"""SELECT id FROM (
            SELECT id, issued_at, ROW_NUMBER() OVER (PARTITION BY node ORDER BY {LATEST_ORDER}) AS rn FROM certs) ranked
        WHERE rn > 1 AND ({' OR '.join(conds)})""", params)  # fmt: skip
    return [int(r[0]) for r in rows]


def prune_command(settings: Settings, db: str | Path | None = None, keep: int | None = None, older_than: float | None = None,
                  dry_run: bool = False, now: Callable[[], datetime] = now_utc) -> PruneReport:  # fmt: skip
    if keep is None and older_than is None:
        raise UsageError("fleet prune: give --keep N (certificates per node) and/or --older-than DAYS")
    if keep is not None and keep < 1:
        raise UsageError(f"--keep must be at least 1 (a node's latest certificate is always kept), got {keep}")
    if older_than is not None and not older_than > 0:
        raise UsageError(f"--older-than must be more than 0 days, got {older_than:g}")
    before = stamp(now() - timedelta(days=older_than)) if older_than is not None else None
    with Store(db_target(settings, db), create=False) as store:
        ids = doomed(store, keep, before)
        if not dry_run:
            for i in range(0, len(ids), CHUNK):
                _remove(store, ids[i : i + CHUNK])
        return PruneReport(store.db.name, len(ids), store.count() - (len(ids) if dry_run else 0), dry_run)


def _remove(store: Store, ids: list[int]) -> None:
    marks = ", ".join("?" * len(ids))
    with store.db.transaction():
        for table in ("perf", "problems", "docs"):
            store.db.execute(f"DELETE FROM {table} WHERE cert_id IN ({marks})", ids)
        store.db.execute(f"DELETE FROM certs WHERE id IN ({marks})", ids)
