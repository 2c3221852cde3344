"""fleet/systemd: the units pass `systemd-analyze verify` (no warning either), the service runs
certify-node.sh with --renew-after and the operator's certify options, and the timer comes back well
within the renewal margin, so a certificate is renewed before it expires."""

import os
import re
import shlex
import subprocess

import pytest

from tests import certify_fakes as cf
from tests.tools import require_tool

UNITS = cf.ROOT / "fleet" / "systemd"
LIFETIME_S = 7 * 86400  # kdactl certify's default certificate lifetime


def setting(unit: str, key: str) -> str:
    (value,) = re.findall(rf"^{key}=(.*)$", (UNITS / unit).read_text(), re.M)
    return value


def test_units_pass_systemd_analyze_verify():
    tool = require_tool("systemd-analyze", "Debian package systemd; .ci/run installs it")
    proc = subprocess.run([tool, "verify", "--man=no", "kdactl-certify.service", "kdactl-certify.timer"], cwd=UNITS,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def test_the_service_renews_before_expiry_with_the_operators_options(tmp_path):
    renew = int(re.search(r"^Environment=KDACTL_RENEW_AFTER_S=(\d+)$", (UNITS / "kdactl-certify.service").read_text(), re.M)[1])
    every = setting("kdactl-certify.timer", "OnUnitInactiveSec")
    assert every == "1h" and renew + 3600 + 600 < LIFETIME_S  # a run at least every 1 h 10 min after the renewal age
    fake = tmp_path / "kdactl-certify-node"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    argv = shlex.split(setting("kdactl-certify.service", "ExecStart").replace("/usr/local/sbin/kdactl-certify-node", str(fake)))
    env = {"PATH": os.environ["PATH"], "KDACTL_RENEW_AFTER_S": str(renew), "KDACTL_CERTIFY_ARGS": "--expect-gpus 8 --expect-sku H200"}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert out == ["--renew-after", "432000", "--expect-gpus", "8", "--expect-sku", "H200"]


@pytest.mark.parametrize("key", ["Type=oneshot", "TimeoutStartSec=4h", "EnvironmentFile=-/etc/default/kdactl", "StateDirectory=kdactl"])
def test_the_service_is_a_oneshot_with_room_for_a_full_run(key):
    assert re.search(rf"^{re.escape(key)}$", (UNITS / "kdactl-certify.service").read_text(), re.M)
