"""Per-node Ed25519 signatures: each node signs its own certificate with its own private key, and a
verifier trusts a public key only for the host it is listed under, so no node can vouch for another
(one shared HMAC key lets any signer forge any node's certificate).

- The private key: a PKCS#8 PEM file (``kdactl keygen --out FILE`` or
  ``openssl genpkey -algorithm ed25519 -out FILE``), given by ``--signing-key`` or KDACTL_SIGNING_KEY.
- What is signed: the certificate's canonical bytes, the very bytes ``integrity.sha256`` hashes
  (RFC 8785 of the document without ``integrity``); the signature is ``integrity.node_signature``
  (``algorithm`` ed25519, ``key_id``, ``value`` the 64 signature bytes in base64).
- The key id: the first 16 hex digits of sha256 over the 32 raw public-key bytes.
- The trusted keys: a text file (``--trusted-keys`` or KDACTL_TRUSTED_KEYS), one ``HOSTNAME KEY``
  per line, KEY the base64 of the 32 raw public-key bytes (what ``kdactl keygen`` prints), ``#``
  comments; a host may have several keys (rotation), a key belongs to one host.

``cryptography`` is an optional extra (``pip install 'kdactl[signing]'``), imported only when a key
is loaded or a signature checked: reading the trusted keys and matching key ids is stdlib, so
``kdactl gate`` on an unsigned setup never loads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdactl.errors import UsageError

SIGNING_ENV = "KDACTL_SIGNING_KEY"
TRUSTED_ENV = "KDACTL_TRUSTED_KEYS"
ALGORITHM = "ed25519"
PUBLIC_KEY_BYTES = 32


class SigningUnavailable(UsageError):
    """A signature must be made or checked and ``cryptography`` is not installed (exit 2)."""


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def public_line(hostname: str, public_raw: bytes) -> str:
    """One line of a trusted-keys file."""
    return f"{hostname} {base64.b64encode(public_raw).decode()}"


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as err:
        raise SigningUnavailable(f"Ed25519 signatures need the Python package 'cryptography' ({err}): "
                                 "pip install 'kdactl[signing]'") from None  # fmt: skip
    return ed25519


# ---------------------------------------------------------------------------------------------
# Trusted public keys (stdlib)


@dataclass(frozen=True)
class TrustedKeys:
    source: str
    by_host: Mapping[str, Mapping[str, bytes]]  # hostname -> key id -> 32 raw public-key bytes

    def owner(self, kid: str) -> str | None:
        return next((host for host, keys in self.by_host.items() if kid in keys), None)


def parse_trusted_keys(text: str, source: str) -> TrustedKeys:
    by_host: dict[str, dict[str, bytes]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source} line {number}"
        if len(fields) != 2:
            raise UsageError(f"{where}: expected 'HOSTNAME BASE64-PUBLIC-KEY', got {len(fields)} fields")
        host, encoded = fields
        try:
            raw = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise UsageError(f"{where}: the key of {host} is not base64") from None
        if len(raw) != PUBLIC_KEY_BYTES:
            raise UsageError(
                f"{where}: the key of {host} is {len(raw)} bytes, an Ed25519 public key is {PUBLIC_KEY_BYTES}"
            )
        kid = key_id(raw)
        other = next((h for h, keys in by_host.items() if kid in keys and h != host), None)
        if other is not None:
            raise UsageError(
                f"{where}: key {kid} is listed for both {other} and {host}: a node's key signs only its own certificate"
            )
        by_host.setdefault(host, {})[kid] = raw
    if not by_host:
        raise UsageError(f"{source} lists no keys (lines 'HOSTNAME BASE64-PUBLIC-KEY')")
    return TrustedKeys(source, by_host)


def read_trusted_keys(env: Mapping[str, str], path: Path | None) -> TrustedKeys | None:
    """--trusted-keys wins over KDACTL_TRUSTED_KEYS; None when neither is set."""
    found = _configured_file(env, path, "--trusted-keys", TRUSTED_ENV)
    if found is None:
        return None
    try:
        text = _read(*found).decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{found[1]}: not UTF-8 text ({err})") from None
    return parse_trusted_keys(text, found[1])


def _configured_file(env: Mapping[str, str], path: Path | None, option: str, variable: str) -> tuple[Path, str] | None:
    """(the file, how to name it in a message): the option wins over the environment variable."""
    if path is not None:
        return Path(path), f"{option} {path}"
    if env.get(variable):
        return Path(env[variable]), f"{variable} {env[variable]}"
    return None


def _read(path: Path, named: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise UsageError(f"{named}: cannot read: {err.strerror or err}") from None


def node_signature_problems(data: bytes, sig: Mapping[str, Any] | None, hostname: str, trusted: TrustedKeys | None,
                            notes: list[str]) -> list[str]:  # fmt: skip
    """Why the node signature over ``data`` (the canonical bytes) does not hold for ``hostname``:
    [] when it does, or when no trusted keys are configured (then a note says it was not checked).
    The key must be one ``trusted`` lists for this very host; SigningUnavailable when the signature
    is to be checked and ``cryptography`` is missing."""
    if trusted is None:
        if sig is not None:
            notes.append(
                f"node signature (key {sig['key_id']}) not checked: no trusted keys (--trusted-keys / {TRUSTED_ENV})"
            )
        return []
    if sig is None:
        return [
            f"certificate has no node signature, but trusted keys are configured ({trusted.source}): a signature by {hostname}'s key is required"
        ]
    kid = sig["key_id"]
    keys = trusted.by_host.get(hostname, {})
    if kid not in keys:
        owner = trusted.owner(kid)
        if owner is not None:
            return [
                f"signed by {owner}'s key {kid}, not by a key of {hostname}: a node's key signs only its own certificate"
            ]
        listed = ", ".join(sorted(keys)) or "none"
        return [f"signed with key {kid}, which {trusted.source} does not trust for {hostname} (its keys: {listed})"]
    public = _ed25519().Ed25519PublicKey.from_public_bytes(keys[kid])
    from cryptography.exceptions import InvalidSignature

    try:
        public.verify(base64.b64decode(sig["value"]), data)
    except InvalidSignature:
        return [f"node signature mismatch (key {kid} of {hostname}): the certificate was changed after it was signed"]
    return []


# ---------------------------------------------------------------------------------------------
# The node's private key


@dataclass(frozen=True)
class NodeSigner:
    private: Any  # cryptography's Ed25519PrivateKey
    public_raw: bytes

    @property
    def key_id(self) -> str:
        return key_id(self.public_raw)

    def sign(self, data: bytes) -> dict[str, str]:
        value = base64.b64encode(self.private.sign(data)).decode()
        return {"algorithm": ALGORITHM, "key_id": self.key_id, "value": value}


def _raw_public(private: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_signer(pem: bytes, source: str) -> NodeSigner:
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        raise UsageError(f"{source}: not an unencrypted PEM private key ({err})") from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{source}: a {type(private).__name__.lstrip('_')}, expected an Ed25519 private key")
    return NodeSigner(private, _raw_public(private))


def read_signer(env: Mapping[str, str], path: Path | None) -> NodeSigner | None:
    """--signing-key wins over KDACTL_SIGNING_KEY; None when neither is set."""
    found = _configured_file(env, path, "--signing-key", SIGNING_ENV)
    return None if found is None else load_signer(_read(*found), found[1])


def new_private_key() -> tuple[bytes, bytes]:
    """(PKCS#8 PEM of a new private key, its 32 raw public-key bytes)."""
    from cryptography.hazmat.primitives import serialization

    private = _ed25519().Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem, _raw_public(private)


def write_private_key(path: Path, pem: bytes) -> None:
    """Owner-only from the first byte, whole or not at all, and never over an existing file (a
    node's key is replaced on purpose, by removing the old one first): written to a temp file
    beside it, then hard-linked into place (a link, unlike a rename, fails when the name exists)."""
    path = Path(path)
    if path.exists():
        raise UsageError(f"--out {path} exists: remove it first to replace the node's key")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    except OSError as err:
        raise UsageError(f"--out {path}: cannot write in {path.parent}: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        raise UsageError(f"--out {path} exists: remove it first to replace the node's key") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
