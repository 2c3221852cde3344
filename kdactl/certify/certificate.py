"""The certificate: schema ``kdactl.cert/v1``, canonical JSON, sha256 digest, optional HMAC-SHA256
signature, atomic writes, and the checks ``kdactl verify`` and ``kdactl gate`` share.

Canonical form: the document without its ``integrity`` field, as JSON with sorted keys, no
whitespace, UTF-8. ``integrity.sha256`` is the hex sha256 of those bytes; ``integrity.signature``
is HMAC-SHA256 over the same bytes with the configured key (KDACTL_CERT_KEY, or a key file).
Ed25519 is not offered: ``cryptography`` is not on the GPU image.

Stdlib only: gate.py imports this, and must start in well under a second.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

from kdactl.atomic import write_text_atomic
from kdactl.errors import UsageError
from kdactl.results import STATUSES

SCHEMA = "kdactl.cert/v1"
VERDICTS = ("certified", "not_certified", "inconclusive")
DEFAULT_LIFETIME_DAYS = 7.0
CLOCK_SKEW = timedelta(minutes=5)  # issued_at may be this far in the future (clocks of two hosts)
REQUIRED_FIELDS = ("schema", "verdict", "issued_at", "expires_at", "node", "versions", "gpus", "results", "integrity")
KEY_ENV = "KDACTL_CERT_KEY"
CANONICAL = "json-sorted-keys-no-whitespace-utf8"
_HEX = frozenset("0123456789abcdef")


class CertUnreadable(UsageError):
    """The certificate file cannot be read at all (missing, permissions): exit 2 in verify."""


class KeyRequired(UsageError):
    """The certificate is signed but no key is configured here: its signature cannot be checked,
    and an unchecked signature could have been changed (exit 2: configure the key)."""


def canonical_bytes(doc: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "integrity"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def digest(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_bytes(doc)).hexdigest()


def key_id(key: bytes) -> str:
    """Names the key without revealing it: the first 16 hex of sha256(key)."""
    return hashlib.sha256(key).hexdigest()[:16]


def sign(doc: Mapping[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical_bytes(doc), hashlib.sha256).hexdigest()


def seal(doc: dict[str, Any], key: bytes | None) -> dict[str, Any]:
    """The document with its integrity field (digest always, signature when a key is given)."""
    out = {k: v for k, v in doc.items() if k != "integrity"}
    integrity: dict[str, Any] = {"algorithm": "sha256", "canonical": CANONICAL, "sha256": digest(out)}
    integrity["signature"] = None if key is None else {"algorithm": "hmac-sha256", "key_id": key_id(key), "value": sign(out, key)}
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
    return datetime.now(timezone.utc)


def stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


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
    """(document, "") or (None, why it is not a certificate). CertUnreadable when the file cannot
    be read at all; a corrupt file (one changed byte can break the JSON) is a bad certificate."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise CertUnreadable(f"cannot read certificate {path}: {err.strerror or err}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"{path} is not valid JSON ({err}): corrupt or tampered"
    if not isinstance(doc, dict):
        return None, f"{path} is not a JSON object"
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


def check_certificate(doc: Mapping[str, Any], key: bytes | None, now: datetime) -> CertCheck:
    """Schema, digest, signature (required when a key is configured), issue and expiry times.
    The integrity field is not covered by the digest, so its every byte is checked exactly: any
    other algorithm name, key id or extra field is a failure. KeyRequired when the certificate is
    signed and no key is configured."""
    out = CertCheck()
    out.failures += check_schema(doc)
    if out.failures:
        return out
    integrity = doc["integrity"]
    out.failures += _check_integrity_shape(integrity)
    if out.failures:
        return out
    actual = digest(doc)
    if integrity["sha256"] != actual:
        out.failures.append(f"digest mismatch: certificate says sha256 {integrity['sha256'][:16]}..., "
                            f"content hashes to {actual[:16]}...: the certificate was changed after it was issued")  # fmt: skip
    out.failures += _check_signature(doc, integrity["signature"], key, out.notes)
    out.failures += check_times(doc, now)
    return out


def _is_hex(value: Any, n: int) -> bool:
    return isinstance(value, str) and len(value) == n and set(value) <= _HEX


def _check_integrity_shape(integrity: Mapping[str, Any]) -> list[str]:
    if set(integrity) != {"algorithm", "canonical", "sha256", "signature"}:
        return [f"integrity has fields {sorted(integrity)}, expected algorithm, canonical, sha256, signature"]
    if integrity["algorithm"] != "sha256" or integrity["canonical"] != CANONICAL:
        return [f"integrity names algorithm {integrity['algorithm']!r} / canonical form {integrity['canonical']!r}; "
                f"expected 'sha256' / {CANONICAL!r}"]  # fmt: skip
    if not _is_hex(integrity["sha256"], 64):
        return [f"integrity.sha256 {str(integrity['sha256'])[:70]!r} is not 64 lower-case hex digits"]
    sig = integrity["signature"]
    if sig is None:
        return []
    if not isinstance(sig, dict) or set(sig) != {"algorithm", "key_id", "value"} or sig["algorithm"] != "hmac-sha256" \
            or not _is_hex(sig["key_id"], 16) or not _is_hex(sig["value"], 64):  # fmt: skip
        return [f"integrity.signature is not a well-formed hmac-sha256 signature: {str(sig)[:160]}"]
    return []


def check_schema(doc: Mapping[str, Any]) -> list[str]:
    """The shape every reader (verify, gate, the fleet store and report) relies on, each failure
    naming its field: a digest proves only that nothing changed since sealing, not that kdactl
    sealed it, so a well-sealed document of the wrong shape must still be refused."""
    if doc.get("schema") != SCHEMA:
        return [f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}"]
    missing = [k for k in REQUIRED_FIELDS if k not in doc]
    if missing:
        return [f"certificate lacks {', '.join(missing)}"]
    bad = []
    if doc["verdict"] not in VERDICTS:
        bad.append(f"verdict {doc['verdict']!r} is not one of {', '.join(VERDICTS)}")
    for name in ("integrity", "node", "versions", "options"):
        if name in doc and not isinstance(doc[name], dict):
            bad.append(f"{name} is {_kind(doc[name])}, expected an object")
    for name, check_item in (("gpus", _gpu_problem), ("results", _result_problem)):
        items = doc[name]
        if not isinstance(items, list):
            bad.append(f"{name} is {_kind(items)}, expected a list")
            continue
        bad += [f"{name}[{i}]{why}" for i, why in enumerate(map(check_item, items)) if why][:1]  # the first says enough
    return bad


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), f"a {type(value).__name__}")  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _gpu_problem(g: Any) -> str:
    if not isinstance(g, dict):
        return f" is {_kind(g)}, expected an object"
    return "" if _is_int(g.get("index")) else f".index {g.get('index')!r} is not an integer"


def _result_problem(r: Any) -> str:
    if not isinstance(r, dict):
        return f" is {_kind(r)}, expected an object"
    if not isinstance(r.get("check"), str):
        return f".check {r.get('check')!r} is not a string"
    if r.get("status") not in STATUSES:
        return f".status {r.get('status')!r} is not one of {', '.join(STATUSES)}"
    if r.get("gpu") is not None and not _is_int(r.get("gpu")):
        return f".gpu {r.get('gpu')!r} is neither an integer nor null"
    return ""


def _check_signature(doc: Mapping[str, Any], sig: Any, key: bytes | None, notes: list[str]) -> list[str]:
    if sig is None:
        if key is not None:
            return ["certificate is not signed, but a key is configured (KDACTL_CERT_KEY / --key-file): signature required"]
        notes.append("unsigned (no key configured): digest checked only")
        return []
    if key is None:
        raise KeyRequired(f"the certificate is signed (key id {sig['key_id']}) and no key is configured: "
                          f"set {KEY_ENV} or pass --key-file to verify it")  # fmt: skip
    if sig["key_id"] != key_id(key):
        return [f"signed with key {sig['key_id']}, the configured key is {key_id(key)}"]
    if not hmac.compare_digest(sig["value"], sign(doc, key)):
        return ["signature mismatch: the certificate was changed after it was signed"]
    return []


def check_times(doc: Mapping[str, Any], now: datetime) -> list[str]:
    issued, expires = parse_stamp(doc.get("issued_at")), parse_stamp(doc.get("expires_at"))
    if issued is None or expires is None:
        return [f"issued_at {doc.get('issued_at')!r} / expires_at {doc.get('expires_at')!r}: not ISO 8601 times with a zone"]
    if issued > now + CLOCK_SKEW:
        return [f"issued in the future: issued_at {stamp(issued)}, now {stamp(now)}"]
    if expires <= now:
        return [f"expired: expires_at {stamp(expires)}, now {stamp(now)} (re-run kdactl certify)"]
    return []
