"""The certificate: schema ``kdactl.cert/v1``, canonical JSON, sha256 digest, optional signatures,
atomic writes, and the checks ``kdactl verify`` and ``kdactl gate`` share.

Canonical form (``integrity.canonical``): ``rfc8785``, the RFC 8785 (JCS) bytes of the document
without its ``integrity`` field (jcs.py), so that any language can recompute it. Certificates sealed
before carry ``json-sorted-keys-no-whitespace-utf8`` (Python's json.dumps with sorted keys, no
whitespace, UTF-8) and are still checked by that rule, so an upgrade does not fail every node.
``integrity.sha256`` is the hex sha256 of the canonical bytes. Over the same bytes:
``integrity.signature``, HMAC-SHA256 with a shared key (KDACTL_CERT_KEY, or a key file), and
``integrity.node_signature``, Ed25519 with the node's own key (signing.py).

Stdlib only: gate.py imports this, and must start in well under a second.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kdactl.atomic import write_text_atomic
from kdactl.certify.jcs import NotCanonicalizable, canonicalize
from kdactl.certify.schema import MAX_BYTES, certificate_problems, load_certificate_bytes
from kdactl.certify.signing import NodeSigner, TrustedKeys, node_signature_problems
from kdactl.errors import UsageError

SCHEMA = "kdactl.cert/v1"
VERDICTS = ("certified", "not_certified", "inconclusive")
DEFAULT_LIFETIME_DAYS = 7.0
CLOCK_SKEW = timedelta(minutes=5)  # issued_at may be this far in the future (clocks of two hosts)
KEY_ENV = "KDACTL_CERT_KEY"
CANONICAL = "rfc8785"
LEGACY_CANONICAL = "json-sorted-keys-no-whitespace-utf8"


class CertUnreadable(UsageError):
    """The certificate file cannot be read at all (missing, permissions): exit 2 in verify."""


class KeyRequired(UsageError):
    """The certificate is signed but no key is configured here: its signature cannot be checked,
    and an unchecked signature could have been changed (exit 2: configure the key)."""


def canonical_bytes(doc: Mapping[str, Any], canonical: str = CANONICAL) -> bytes:
    """The bytes the digest and signatures cover; jcs.NotCanonicalizable for a value RFC 8785
    cannot hold (an integer beyond 2**53 - 1)."""
    body = {k: v for k, v in doc.items() if k != "integrity"}
    if canonical == LEGACY_CANONICAL:
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return canonicalize(body)


def digest(doc: Mapping[str, Any], canonical: str = CANONICAL) -> str:
    return hashlib.sha256(canonical_bytes(doc, canonical)).hexdigest()


def key_id(key: bytes) -> str:
    """Names the key without revealing it: the first 16 hex of sha256(key)."""
    return hashlib.sha256(key).hexdigest()[:16]


def hmac_value(data: bytes, key: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def seal(doc: dict[str, Any], key: bytes | None, signer: NodeSigner | None = None) -> dict[str, Any]:
    """The document with its integrity field: the digest always, the HMAC signature when a key is
    given, the node's Ed25519 signature when a signer is."""
    out = {k: v for k, v in doc.items() if k != "integrity"}
    data = canonical_bytes(out)
    integrity: dict[str, Any] = {
        "algorithm": "sha256",
        "canonical": CANONICAL,
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    integrity["signature"] = (
        None if key is None else {"algorithm": "hmac-sha256", "key_id": key_id(key), "value": hmac_value(data, key)}
    )
    if signer is not None:
        integrity["node_signature"] = signer.sign(data)
    out["integrity"] = integrity
    return out


def read_key(env: Mapping[str, str], key_file: Path | None) -> bytes | None:
    """--key-file wins over KDACTL_CERT_KEY; None when neither is set. Trailing newlines are not key."""
    if key_file is not None:
        try:
            key = Path(key_file).read_bytes().rstrip(b"\r\n")
        except OSError as err:
            raise UsageError(f"--key-file {key_file}: cannot read: {err.strerror}") from None
        if not key:
            raise UsageError(f"--key-file {key_file} is empty")
        return key
    value = env.get(KEY_ENV)
    return value.encode() if value else None


# ---------------------------------------------------------------------------------------------
# Times


def now_utc() -> datetime:
    return datetime.now(UTC)


def stamp(t: datetime) -> str:
    return t.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_stamp(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def lifetime(days: float) -> timedelta:
    if not (0 < days <= 366):
        raise UsageError(f"--lifetime must be more than 0 and at most 366 days, got {days:g}")
    return timedelta(days=days)


# ---------------------------------------------------------------------------------------------
# Files


def certificate_text(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_certificate(path: Path, doc: Mapping[str, Any]) -> None:
    write_text_atomic(path, certificate_text(doc))


def check_writable(path: Path, option: str) -> None:
    """UsageError unless ``path`` can be written atomically: not a directory itself, and its
    nearest existing directory one this user can write (the writer creates the missing ones)."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; name a file")
    existing = next(d for d in (path.parent, *path.parent.parents) if d.exists())
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: directory {existing} is not writable by this user")


def read_certificate(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(document, "") or (None, why it is not a certificate) by the strict loader
    (kdactl.certify.schema). CertUnreadable when the file cannot be read at all; a corrupt file (one
    changed byte can break the JSON) is a bad certificate."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)  # no more than the loader accepts, whatever the file's size
    except OSError as err:
        raise CertUnreadable(f"cannot read certificate {path}: {err.strerror or err}") from None
    doc, problems = load_certificate_bytes(raw)
    if doc is None:
        return None, f"{path}: {'; '.join(problems)}"
    return doc, ""


# ---------------------------------------------------------------------------------------------
# Checks shared by verify and gate


@dataclass
class CertCheck:
    """What verify found: each failure one line; notes do not fail."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def check_certificate(doc: Mapping[str, Any], key: bytes | None, now: datetime,
                      trusted: TrustedKeys | None = None) -> CertCheck:  # fmt: skip
    """Schema (kdactl.certify.schema: types at every depth, the integrity field's every byte),
    digest by the certificate's own canonical rule, HMAC signature (required when a key is
    configured), node signature (required, by a key trusted for this node's hostname, when trusted
    keys are configured), issue and expiry times. KeyRequired when the certificate carries an HMAC
    signature and no key is configured; SigningUnavailable when a node signature is to be checked
    and ``cryptography`` is missing."""
    problems = check_schema(doc)
    if problems:
        return CertCheck(failures=problems)
    return check_sealed(doc, key, now, trusted)


def check_sealed(doc: Mapping[str, Any], key: bytes | None, now: datetime,
                 trusted: TrustedKeys | None = None) -> CertCheck:  # fmt: skip
    """check_certificate's checks after the schema, for a document that has passed check_schema
    (the schema is the costly part on a large certificate: a reader that ran it need not again)."""
    out = CertCheck()
    integrity = doc["integrity"]
    try:
        data = canonical_bytes(doc, integrity["canonical"])
    except NotCanonicalizable as err:
        out.failures.append(f"no RFC 8785 form, so no digest can match: {err}")
        return out
    actual = hashlib.sha256(data).hexdigest()
    if integrity["sha256"] != actual:
        out.failures.append(f"digest mismatch: certificate says sha256 {integrity['sha256'][:16]}..., "
                            f"content hashes to {actual[:16]}...: the certificate was changed after it was issued")  # fmt: skip
    out.failures += _check_signature(data, integrity["signature"], key, out.notes)
    node_sig = integrity.get("node_signature")
    if node_sig is not None and integrity["canonical"] != CANONICAL:
        out.failures.append(
            f"a node signature needs canonical {CANONICAL!r}, the certificate says {integrity['canonical']!r}"
        )
    else:
        out.failures += node_signature_problems(data, node_sig, doc["node"]["hostname"], trusted, out.notes)
    out.failures += check_times(doc, now)
    return out


def check_schema(doc: Any) -> list[str]:
    """The one validation of every reader (verify, gate, the fleet store and report), each problem
    naming its JSON path: a digest proves only that nothing changed since sealing, not that kdactl
    sealed it, so a well-sealed document of the wrong shape must still be refused."""
    return certificate_problems(doc)


def _check_signature(data: bytes, sig: Any, key: bytes | None, notes: list[str]) -> list[str]:
    if sig is None:
        if key is not None:
            return [
                "certificate is not signed, but a key is configured (KDACTL_CERT_KEY / --key-file): signature required"
            ]
        notes.append("no HMAC signature (unsigned), and no HMAC key configured")
        return []
    if key is None:
        raise KeyRequired(f"the certificate is signed (key id {sig['key_id']}) and no key is configured: "
                          f"set {KEY_ENV} or pass --key-file to verify it")  # fmt: skip
    if sig["key_id"] != key_id(key):
        return [f"signed with key {sig['key_id']}, the configured key is {key_id(key)}"]
    if not hmac.compare_digest(sig["value"], hmac_value(data, key)):
        return ["signature mismatch: the certificate was changed after it was signed"]
    return []


def check_times(doc: Mapping[str, Any], now: datetime) -> list[str]:
    issued, expires = parse_stamp(doc.get("issued_at")), parse_stamp(doc.get("expires_at"))
    if issued is None or expires is None:
        return [
            f"issued_at {doc.get('issued_at')!r} / expires_at {doc.get('expires_at')!r}: not ISO 8601 times with a zone"
        ]
    if issued > now + CLOCK_SKEW:
        return [f"issued in the future: issued_at {stamp(issued)}, now {stamp(now)}"]
    if expires <= now:
        return [f"expired: expires_at {stamp(expires)}, now {stamp(now)} (re-run kdactl certify)"]
    return []
