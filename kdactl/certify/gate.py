"""``kdactl gate``: a fast (well under a second) yes/no for Slurm HealthCheckProgram / Prolog and
Kubernetes readiness, from the cached certificate and the node's fingerprint now.

Passes only when the certificate is a valid document (kdactl.certify.schema), intact (digest;
HMAC signature when a key is configured; node signature by a key trusted for this very host when
trusted keys are configured), not expired, says ``certified``, covers a full (not ``--quick``)
run of every GPU on the node, and the node's GPU uuids, driver, CUDA toolkit and kernel library build
inputs are what they were at certification (fingerprint.py). Exit 0 pass; 1 fail (each reason one
line, an invalid certificate included); 3 cannot tell (NVML cannot be read, or an otherwise valid
certificate says ``inconclusive``: SPEC exit 3).
No certificate at all is a fail (1): an uncertified node must not take work.

No torch here: GPUs and driver come from NVML, the toolkit from nvcc, the library's build inputs
from its verified manifest. Nothing is loaded or built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kdactl.certify import certificate as cm
from kdactl.certify import fingerprint as fp
from kdactl.certify import signing
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS, KdactlError
from kdactl.settings import Settings


@dataclass
class GateReport:
    path: str
    failures: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # could not tell
    summary: str = ""

    @property
    def exit_code(self) -> int:
        if self.failures:
            return EXIT_NOT_CERTIFIED
        return EXIT_INCONCLUSIVE if self.unknown else EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        result = {EXIT_PASS: "pass", EXIT_NOT_CERTIFIED: "fail"}.get(self.exit_code, "unknown")
        return {"command": "gate", "result": result, "exit_code": self.exit_code, "certificate": self.path,
                "reasons": self.failures + self.unknown, "summary": self.summary}  # fmt: skip

    def render(self, console: Any) -> None:
        if self.exit_code == EXIT_PASS:
            console.print(f"PASS: {self.summary}", markup=False)
        for line in self.failures:
            console.print(f"FAIL: {line}", markup=False)
        for line in self.unknown:
            console.print(f"UNKNOWN: {line}", markup=False)


def gate_command(settings: Settings, cert_path: Path | None = None, key_file: Path | None = None,
                 trusted_keys: Path | None = None, now: Callable[[], datetime] = cm.now_utc, node_reader: Callable[[Settings], fp.NodeNow] | None = None,
                 artifacts: Callable[..., tuple[dict, dict]] = fp.artifacts_for) -> GateReport:  # fmt: skip
    path = Path(cert_path) if cert_path else settings.data_dir / "cert.json"
    report = GateReport(str(path))
    if not path.exists():
        report.failures.append(f"no certificate at {path}: this node is not certified (run kdactl certify)")
        return report
    key = cm.read_key(settings.env, key_file)
    trusted = signing.read_trusted_keys(settings.env, trusted_keys)
    try:
        doc, why = cm.read_certificate(path)
    except cm.CertUnreadable as err:
        report.unknown.append(str(err))
        return report
    if doc is None:
        report.failures.append(why)
        return report
    invalid = cm.check_schema(doc)
    if invalid:  # nothing in it can be trusted to mean what it says, not even its verdict
        report.failures += [f"invalid certificate ({cm.SCHEMA}): {p}" for p in invalid]
        return report
    try:
        reasons = certificate_reasons(doc, key, now(), trusted, check=cm.check_sealed)  # the schema passed above
    except cm.KeyRequired as err:
        report.unknown.append(str(err))
    else:  # an inconclusive certificate is no evidence against the node: it says "cannot tell" (3)
        unknown = verdict_reason(doc) if doc.get("verdict") == "inconclusive" else None
        report.failures += [r for r in reasons if r != unknown]
        report.unknown += [unknown] if unknown in reasons else []
    _check_node(settings, doc, report, node_reader or fp.read_node_now, artifacts)
    report.summary = f"{doc.get('verdict')} {path}, {len(doc.get('gpus') or [])} GPUs, expires {doc.get('expires_at')}"
    return report


def certificate_reasons(doc: Mapping[str, Any], key: bytes | None, now: datetime,
                        trusted: signing.TrustedKeys | None = None,
                        check: Callable[..., cm.CertCheck] = cm.check_certificate) -> list[str]:  # fmt: skip
    out = list(check(doc, key, now, trusted).failures)
    if doc.get("verdict") != "certified":
        out.append(verdict_reason(doc))
    if doc.get("scope") != "full":
        out.append(
            f"certificate scope is {doc.get('scope')!r}: only a full kdactl certify (not --quick) admits the node"
        )
    return out


def verdict_reason(doc: Mapping[str, Any]) -> str:
    return f"verdict is {doc.get('verdict')}: {doc.get('reason') or 'no reason recorded'}"


def _check_node(settings: Settings, doc: Mapping[str, Any], report: GateReport,
                node_reader: Callable[[Settings], fp.NodeNow], artifacts: Callable[..., tuple[dict, dict]]) -> None:  # fmt: skip
    try:
        now = node_reader(settings)
    except KdactlError as err:
        report.unknown.append(f"cannot read the node now: {err}")
        return
    certified = {g["uuid"]: g for g in doc["gpus"]}
    report.failures += [
        f"GPU {i} ({u}) is not covered by the certificate" for i, u in enumerate(now.gpu_uuids) if u not in certified
    ]
    fallback = {g.get("target") for g in certified.values() if g.get("target")}
    try:
        targets = fp.node_targets(settings, now.ccs, now.toolkit, fallback)
    except KdactlError as err:
        report.failures.append(f"kernel target: {err}")
        return
    arts, why_none = artifacts(settings, targets)
    current = fp.Fingerprint(now.gpu_uuids, now.driver_version, _v(now.toolkit), arts, why_none)
    recorded = doc["node"]["fingerprint"]
    report.failures += fp.compare(recorded, current)


def _v(version: tuple[int, int] | None) -> str | None:
    return None if version is None else f"{version[0]}.{version[1]}"
