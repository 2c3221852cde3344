"""fleet/k8s/kdactl-node-loop.sh with fake kdactl, kdactl-certify-node and kubectl on PATH: a node is
certified and untainted, renewed before expiry, tainted again when its certificate stops passing,
and a failing node is not re-certified every round."""

import subprocess

import pytest

from tests import certify_fakes as cf

SCRIPT = cf.ROOT / "fleet" / "k8s" / "kdactl-node-loop.sh"

# gate exits the number in $STATE/gate; certify-node exits the next code in $STATE/certify (the last
# repeats) and, on 0, makes the gate pass; every call is logged to $STATE/calls.
FAKES = {
    "kdactl": '#!/bin/sh\necho "kdactl $*" >> "$STATE/calls"\n[ "$1" = gate ] && exit "$(cat "$STATE/gate")"\nexit 0\n',
    "kdactl-certify-node": '#!/bin/sh\necho "certify-node $*" >> "$STATE/calls"\n'
                           'codes=$(cat "$STATE/certify"); first=${codes%% *}; rest=${codes#* }\n'
                           '[ "$rest" = "$codes" ] || echo "$rest" > "$STATE/certify"\n'
                           '[ "$first" -eq 0 ] && echo 0 > "$STATE/gate"\nexit "$first"\n',
    "kubectl": '#!/bin/sh\necho "kubectl $*" >> "$STATE/calls"\n',
}


@pytest.fixture
def loop(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in FAKES.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)

    def run(gate: int, certify: str, rounds: int, **env: str) -> list[str]:
        (tmp_path / "gate").write_text(f"{gate}\n")
        (tmp_path / "certify").write_text(certify)
        (tmp_path / "calls").write_text("")
        full = {"PATH": f"{bin_}:/usr/bin:/bin", "STATE": str(tmp_path), "NODE_NAME": "gpu-7", "KDACTL_LOOP_ROUNDS": str(rounds),
                "KDACTL_CHECK_EVERY_S": "0", "FEATURES_DIR": str(tmp_path), **env}  # fmt: skip
        proc = subprocess.run(["sh", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [c for c in (tmp_path / "calls").read_text().splitlines() if not c.startswith("kdactl gate")]

    return run


UNTAINT = "kubectl taint nodes gpu-7 kdactl.io/uncertified:NoSchedule-"
TAINT = "kubectl taint nodes gpu-7 kdactl.io/uncertified=true:NoSchedule --overwrite"
LABELS = "kdactl k8s labels --features-dir "


def test_a_new_node_is_certified_then_untainted_once(loop):
    calls = loop(gate=1, certify="0", rounds=3)
    certifies = [c for c in calls if c.startswith("certify-node")]
    assert certifies == ["certify-node --renew-after 432000"] * 3  # a no-op while the certificate is young
    assert [c for c in calls if c.startswith("kubectl")] == [UNTAINT]
    assert sum(c.startswith(LABELS) for c in calls) == 3


def test_a_node_whose_certificate_fails_is_tainted_and_retried_after_a_while(loop):
    calls = loop(gate=1, certify="1", rounds=3, KDACTL_RETRY_AFTER_S="3600", KDACTL_RENEW_AFTER_S="100", KDACTL_CERTIFY_ARGS="--lifetime 7 --expect-gpus 8")
    assert [c for c in calls if c.startswith("certify-node")] == ["certify-node --renew-after 100 --lifetime 7 --expect-gpus 8"]
    assert [c for c in calls if c.startswith("kubectl")] == [TAINT]
    calls = loop(gate=1, certify="1 0", rounds=2, KDACTL_RETRY_AFTER_S="0")
    assert len([c for c in calls if c.startswith("certify-node")]) == 2
    assert [c for c in calls if c.startswith("kubectl")] == [TAINT, UNTAINT]


def test_a_certified_node_that_stops_passing_is_tainted_again(loop, tmp_path):
    """The renewal leaves the gate failing (expired, or the driver changed): the taint comes back."""
    calls = loop(gate=0, certify="3", rounds=1)
    assert calls[0] == "certify-node --renew-after 432000"
    assert [c for c in calls if c.startswith("kubectl")] == [UNTAINT]  # gate still passes: an old valid certificate was kept
    (tmp_path / "bin" / "kdactl-certify-node").write_text('#!/bin/sh\necho "certify-node $*" >> "$STATE/calls"\necho 1 > "$STATE/gate"\nexit 1\n')
    calls = loop(gate=0, certify="1", rounds=1)
    assert [c for c in calls if c.startswith("kubectl")] == [TAINT]


def test_node_name_is_required(tmp_path):
    proc = subprocess.run(["sh", str(SCRIPT)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "NODE_NAME" in proc.stderr
