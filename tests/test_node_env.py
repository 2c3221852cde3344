"""The signing variables reach kdactl on bare metal: the Slurm scripts export what /etc/default/kdactl
sets (the file systemd's unit reads too), and certify-node.sh's kdactl calls inherit its environment."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIGNING = {"KDACTL_SIGNING_KEY": "/etc/kdactl/node.pem", "KDACTL_TRUSTED_KEYS": "/etc/kdactl/trusted-keys"}
# Fake kdactl: records each call's subcommand and the two variables as it sees them; gate passes.
FAKE = """#!/bin/sh
echo "$1 key=${KDACTL_SIGNING_KEY:-unset} trusted=${KDACTL_TRUSTED_KEYS:-unset}" >> "$CALLS"
exit 0
"""


@pytest.fixture
def fake(tmp_path):
    (tmp_path / "kdactl").write_text(FAKE)
    (tmp_path / "kdactl").chmod(0o755)
    (tmp_path / "logger").write_text("#!/bin/sh\n")
    (tmp_path / "logger").chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"), "HOME": str(tmp_path),
           "KDACTL_DATA_DIR": str(tmp_path / "data"), "KDACTL_LOG_DIR": str(tmp_path / "log")}  # fmt: skip
    return tmp_path, env


def _seen(tmp: Path) -> list[str]:
    return (tmp / "calls").read_text().splitlines()


@pytest.mark.parametrize("script", ["kdactl-healthcheck", "kdactl-prolog"])
def test_slurm_scripts_export_the_defaults_file_to_kdactl(fake, script):
    tmp, env = fake
    defaults = tmp / "default-kdactl"
    defaults.write_text("".join(f"{k}={v}\n" for k, v in SIGNING.items()))  # plain assignments, as systemd reads them
    text = (ROOT / "fleet" / "slurm" / script).read_text()
    assert "/etc/default/kdactl" in text
    (tmp / script).write_text(text.replace("/etc/default/kdactl", str(defaults)))
    subprocess.run(["sh", str(tmp / script)], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert _seen(tmp)[0] == "gate key=/etc/kdactl/node.pem trusted=/etc/kdactl/trusted-keys"


def test_certify_node_passes_the_signing_variables_to_every_kdactl_call(fake):
    tmp, env = fake
    script = ROOT / "fleet" / "provision" / "certify-node.sh"
    subprocess.run(["bash", str(script), "--force"], env={**env, **SIGNING}, capture_output=True, text=True, timeout=30, check=True)
    seen = _seen(tmp)
    assert [c.split()[0] for c in seen] == ["certify"] and all(c.endswith("key=/etc/kdactl/node.pem trusted=/etc/kdactl/trusted-keys") for c in seen)
    (tmp / "calls").unlink()
    subprocess.run(["bash", str(script)], env={**env, **SIGNING}, capture_output=True, text=True, timeout=30, check=True)
    assert _seen(tmp) == ["gate key=/etc/kdactl/node.pem trusted=/etc/kdactl/trusted-keys"]
