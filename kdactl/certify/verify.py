"""``kdactl verify CERT``: is this certificate intact, signed when a key (HMAC) or trusted node keys
(Ed25519) are configured, and unexpired? Exit 0 valid; 1 changed, corrupt, expired, unsigned or
wrongly signed (a node signature by a key not trusted for the certificate's own host included); 2
when the file cannot be read at all, or a usage error (``cryptography`` missing for a signature
that must be checked). A valid certificate may say ``not_certified``: verify
judges the document, not the node."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from kdactl.certify import certificate as cm
from kdactl.certify import signing
from kdactl.errors import EXIT_NOT_CERTIFIED, EXIT_PASS
from kdactl.settings import Settings


@dataclass
class VerifyReport:
    path: str
    doc: dict[str, Any] | None
    failures: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_NOT_CERTIFIED if self.failures else EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        d = self.doc or {}
        integrity: dict[str, Any] = d["integrity"] if isinstance(d.get("integrity"), dict) else {}
        node: dict[str, Any] = (
            d["node"] if isinstance(d.get("node"), dict) else {}
        )  # a malformed one is a failure, listed
        return {"command": "verify", "path": self.path, "valid": not self.failures, "exit_code": self.exit_code,
                "verdict": d.get("verdict"), "scope": d.get("scope"), "hostname": node.get("hostname"),
                "issued_at": d.get("issued_at"), "expires_at": d.get("expires_at"), "sha256": integrity.get("sha256"),
                "signed": bool(integrity.get("signature")),
                "node_signature": (integrity.get("node_signature") or {}).get("key_id"), "failures": self.failures, "notes": self.notes}  # fmt: skip

    def render(self, console: Console) -> None:
        j = self.to_json()
        if self.failures:
            console.print(f"INVALID: {self.path}", markup=False)
            for line in self.failures:
                console.print(f"  {line}", markup=False)
        else:
            console.print(f"VALID: {self.path}: verdict {j['verdict']} ({j['scope']}) for {j['hostname']}, "
                          f"issued {j['issued_at']}, expires {j['expires_at']}, sha256 {j['sha256']}", markup=False)  # fmt: skip
        for line in self.notes:
            console.print(f"  note: {line}", markup=False)


def verify_command(settings: Settings, path: Path, key_file: Path | None = None, trusted_keys: Path | None = None,
                   now: Callable[[], datetime] = cm.now_utc) -> VerifyReport:  # fmt: skip
    key = cm.read_key(settings.env, key_file)
    trusted = signing.read_trusted_keys(settings.env, trusted_keys)
    doc, why = cm.read_certificate(path)  # CertUnreadable (exit 2) when it cannot be read at all
    if doc is None:
        return VerifyReport(str(path), None, [why])
    found = cm.check_certificate(doc, key, now(), trusted)
    return VerifyReport(str(path), doc, found.failures, found.notes)
