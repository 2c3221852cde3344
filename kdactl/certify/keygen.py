"""``kdactl keygen --out FILE``: a new Ed25519 key for this node. The private key goes to FILE
(PKCS#8 PEM, mode 0600, never over an existing file); the line for the verifiers' trusted-keys file
(``HOSTNAME BASE64-PUBLIC-KEY``) is printed."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdactl.certify import signing
from kdactl.errors import EXIT_PASS, UsageError
from kdactl.settings import Settings


@dataclass
class KeygenReport:
    path: str
    hostname: str
    key_id: str
    trusted_line: str
    exit_code: int = EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        return {"command": "keygen", "path": self.path, "hostname": self.hostname, "key_id": self.key_id,
                "trusted_keys_line": self.trusted_line, "exit_code": self.exit_code}  # fmt: skip

    def render(self, console: Any) -> None:
        console.print(
            f"# wrote {self.path} (key id {self.key_id}); add this line to the verifiers' trusted-keys file:",
            markup=False,
        )
        console.print(self.trusted_line, markup=False)


def keygen_command(settings: Settings, out: Path, hostname: str | None = None) -> KeygenReport:
    host = hostname if hostname is not None else socket.gethostname()
    if not host or any(c.isspace() or c == "#" for c in host):
        raise UsageError(
            f"--hostname {host!r}: a hostname is one word without '#' (it is the first field of a trusted-keys line)"
        )
    pem, public_raw = signing.new_private_key()
    signing.write_private_key(Path(out), pem)
    return KeygenReport(str(out), host, signing.key_id(public_raw), signing.public_line(host, public_raw))
