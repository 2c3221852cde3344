"""fleet/provision/certify-node.sh with a fake kdactl (and logger) on PATH."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "fleet" / "provision" / "certify-node.sh"

# Fake kdactl: `gate` exits $GATE_RC; `certify` exits the next code from certify-codes (the last repeats)
# and writes "cert <code>" to its --out file.
FAKE = """#!/bin/sh
echo "$*" >> "$CALLS"
if [ "$1" = gate ]; then exit "${GATE_RC:-1}"; fi
codes=$(cat "$CODES"); first=${codes%% *}; rest=${codes#* }
[ "$rest" = "$codes" ] || echo "$rest" > "$CODES"
prev=""; for a in "$@"; do [ "$prev" = "--out" ] && echo "cert $first" > "$a"; prev=$a; done
echo "fake certify output"
exit "$first"
"""
LOGGER = '#!/bin/sh\necho "$*" >> "$SYSLOG"\n'


@pytest.fixture
def node(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("kdactl", FAKE), ("logger", LOGGER)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)

    def run(codes: str, gate_rc: int = 1, *args: str) -> tuple[int, list[str]]:
        (tmp_path / "codes").write_text(codes)
        (tmp_path / "calls").write_text("")
        env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
               "CODES": str(tmp_path / "codes"), "GATE_RC": str(gate_rc), "SYSLOG": str(tmp_path / "syslog"),
               "KDACTL_DATA_DIR": str(tmp_path / "data"), "KDACTL_LOG_DIR": str(tmp_path / "log"), "KDACTL_BACKOFF_S": "0"}  # fmt: skip
        p = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
        return p.returncode, (tmp_path / "calls").read_text().splitlines()

    run.tmp = tmp_path
    return run


def _certifies(calls):
    return [c for c in calls if c.startswith("certify")]


@pytest.mark.parametrize("code", [0, 1, 2])
def test_exit_code_passes_through_without_retry(node, code):
    rc, calls = node(str(code))
    assert rc == code and len(_certifies(calls)) == 1


def test_inconclusive_is_retried_until_it_resolves(node):
    rc, calls = node("3 3 0")
    assert rc == 0 and len(_certifies(calls)) == 3
    rc, calls = node("3 1")
    assert rc == 1 and len(_certifies(calls)) == 2


def test_inconclusive_gives_up_with_3_after_the_retries(node):
    rc, calls = node("3")
    assert rc == 3 and len(_certifies(calls)) == 3  # first attempt + KDACTL_RETRIES=2


def test_idempotent_when_gate_already_passes(node):
    rc, calls = node("1", gate_rc=0)
    assert rc == 0 and calls == ["gate"]
    rc, calls = node("0", 0, "--force", "--expect-gpus", "8")
    out = f"{node.tmp}/data/cert-next.json"
    assert rc == 0 and _certifies(calls) == [f"certify --out {out} --junit {node.tmp}/log/certify-junit.xml --expect-gpus 8"]
    assert (node.tmp / "data" / "cert.json").read_text() == "cert 0\n" and not Path(out).exists()


def test_renews_a_valid_certificate_only_once_it_is_old_enough(node):
    rc, calls = node("0", 0, "--renew-after", "3600")  # no certificate file yet: age 0
    assert rc == 0 and calls == ["gate"]
    cert = node.tmp / "data" / "cert.json"
    cert.write_text("old\n")
    os.utime(cert, (0, 1_000_000))  # years old
    rc, calls = node("0", 0, "--renew-after", "3600")
    assert rc == 0 and len(_certifies(calls)) == 1 and cert.read_text() == "cert 0\n"
    rc, calls = node("0", 0, "--renew-after", "3600")  # just renewed
    assert rc == 0 and calls == ["gate"]


def test_inconclusive_renewal_keeps_a_certificate_that_still_passes(node):
    cert = node.tmp / "data" / "cert.json"
    cert.parent.mkdir()
    cert.write_text("old\n")
    rc, calls = node("3", 0, "--renew-after", "0")
    assert rc == 3 and len(_certifies(calls)) == 3 and cert.read_text() == "old\n"
    assert not (node.tmp / "data" / "cert-next.json").exists()
    rc, calls = node("3", 1)  # nothing valid to keep: the inconclusive certificate says so
    assert rc == 3 and cert.read_text() == "cert 3\n"
    rc, calls = node("1", 0, "--renew-after", "0")  # evidence against the node replaces a valid certificate
    assert rc == 1 and cert.read_text() == "cert 1\n"


@pytest.mark.parametrize("bad", ["", "5d", "-1"])
def test_renew_after_needs_seconds(node, bad):
    rc, calls = node("0", 1, "--renew-after", bad)
    assert rc == 2 and calls == []


def test_logs_to_file_and_syslog(node):
    node("3 0")
    log = (node.tmp / "log" / "certify.log").read_text()
    assert "fake certify output" in log and "inconclusive (exit 3); retrying" in log and "certified (attempt 2)" in log
    syslog = (node.tmp / "syslog").read_text()
    assert "-t kdactl -- certify-node: certified (attempt 2)" in syslog
