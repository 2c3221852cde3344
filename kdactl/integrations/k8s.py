"""``kdactl k8s labels --features-dir DIR``: Node Feature Discovery labels from the cached certificate.

Writes ``DIR/kdactl`` (NFD's local source reads every file in features.d) atomically:

    # +expiry-time=2026-05-08T12:00:00Z
    kdactl.io/certified=true
    kdactl.io/kernel-target=sm_90a
    kdactl.io/cert-expiry=2026-05-08

``certified`` is true only when the certificate is intact (digest; signature when a key is
configured), unexpired, says ``certified`` and covers a full run; anything else, including no
certificate, is false. The expiry directive makes NFD drop the labels when the certificate expires
even if nothing rewrites the file. NFD must allow the namespace: ``-extra-label-ns=kdactl.io``.
The node's current fingerprint is not checked here: that is ``kdactl gate``'s job (readiness probe).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kdactl.atomic import write_text_atomic
from kdactl.certify import certificate as cm
from kdactl.certify.signing import TrustedKeys, read_trusted_keys
from kdactl.errors import EXIT_PASS, UsageError
from kdactl.settings import Settings

PREFIX = "kdactl.io/"
FILE_NAME = "kdactl"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass
class LabelsReport:
    path: str
    labels: dict[str, str]
    expiry: str | None
    reasons: list[str] = field(default_factory=list)  # why certified is false
    exit_code: int = EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        return {"command": "k8s labels", "path": self.path, "labels": self.labels, "expiry_time": self.expiry,
                "reasons": self.reasons, "exit_code": self.exit_code}  # fmt: skip

    def render(self, console: Any) -> None:
        console.print(f"wrote {self.path}: " + " ".join(f"{k}={v}" for k, v in self.labels.items()), markup=False)
        for line in self.reasons:
            console.print(f"  not certified: {line}", markup=False)


def labels_for(doc: dict[str, Any] | None, why_none: str, key: bytes | None, now: datetime,
               trusted: TrustedKeys | None = None) -> tuple[dict[str, str], str | None, list[str]]:  # fmt: skip
    """(labels, expiry stamp or None, reasons certified is false): a pure function of the document."""
    from kdactl.certify.gate import certificate_reasons

    if doc is None:
        return {f"{PREFIX}certified": "false"}, None, [why_none]
    try:
        reasons = certificate_reasons(doc, key, now, trusted)
    except cm.KeyRequired as err:
        reasons = [str(err)]
    labels = {f"{PREFIX}certified": "false" if reasons else "true"}
    targets = sorted({str(g.get("target")) for g in doc.get("gpus") or [] if isinstance(g, dict) and g.get("target")})
    if targets and _LABEL_VALUE.match(".".join(targets)):
        labels[f"{PREFIX}kernel-target"] = ".".join(targets)
    expires = cm.parse_stamp(doc.get("expires_at"))
    if expires is not None:
        labels[f"{PREFIX}cert-expiry"] = expires.date().isoformat()
    return labels, cm.stamp(expires) if expires and not reasons else None, reasons


def feature_file(labels: dict[str, str], expiry: str | None) -> str:
    head = [f"# +expiry-time={expiry}"] if expiry else []
    return "\n".join(head + ["# written by kdactl k8s labels"] + [f"{k}={v}" for k, v in labels.items()]) + "\n"


def labels_command(settings: Settings, features_dir: Path, cert_path: Path | None = None, key_file: Path | None = None,
                   now: Callable[[], datetime] = cm.now_utc, trusted_keys: Path | None = None) -> LabelsReport:  # fmt: skip
    features_dir = Path(features_dir)
    if not features_dir.is_dir():
        raise UsageError(f"--features-dir {features_dir} is not a directory (NFD's features.d, mounted into the pod)")
    key = cm.read_key(settings.env, key_file)
    trusted = read_trusted_keys(settings.env, trusted_keys)
    path = Path(cert_path) if cert_path else settings.data_dir / "cert.json"
    doc, why = None, f"no certificate at {path} (run kdactl certify)"
    if path.exists():
        try:
            doc, why = cm.read_certificate(path)
        except cm.CertUnreadable as err:
            why = str(err)
    labels, expiry, reasons = labels_for(doc, why, key, now(), trusted)
    out = features_dir / FILE_NAME
    try:
        write_text_atomic(out, feature_file(labels, expiry))
    except OSError as err:
        raise UsageError(f"--features-dir {features_dir}: cannot write {out}: {err.strerror or err}") from None
    return LabelsReport(str(out), labels, expiry, reasons)
