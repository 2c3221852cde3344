"""Against a real single-host Slurm (tests/slurm_cluster.py): a failing gate drains the node with a
"kdactl:" reason, a passing gate resumes it, and an operator's drain survives kdactl."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import slurm_cluster

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]
HEALTHCHECK = ROOT / "fleet" / "slurm" / "kdactl-healthcheck"
PROLOG = ROOT / "fleet" / "slurm" / "kdactl-prolog"

# kdactl as the scripts call it: this checkout's CLI; FAKE_GATE_RC stands in for a certified GPU node's gate.
SHIM = f"""#!/bin/sh
if [ "$1" = gate ] && [ -n "$FAKE_GATE_RC" ]; then echo "PASS: fake gate"; exit "$FAKE_GATE_RC"; fi
exec {sys.executable} -m kdactl "$@"
"""


@pytest.fixture(scope="module")
def cluster():
    why = slurm_cluster.missing()
    if why and os.environ.get("KDACTL_REQUIRE_SLURM"):
        pytest.fail(f"KDACTL_REQUIRE_SLURM is set (CI) but there is no local Slurm: {why}")
    if why:
        pytest.skip(f"no local Slurm: {why}")
    c = slurm_cluster.start()
    yield c
    c.stop()
    assert all(p.poll() is not None for p in c.procs)


@pytest.fixture
def env(cluster, tmp_path):
    shim = tmp_path / "kdactl"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    e = {**cluster.env, "KDACTL": str(shim), "KDACTL_DATA_DIR": str(tmp_path / "data"), "SLURMD_NODENAME": cluster.node,
         "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}  # fmt: skip
    e.pop("FAKE_GATE_RC", None)
    yield e
    cluster.scontrol("update", f"nodename={cluster.node}", "state=resume")  # leave it idle for the next test


def _sh(script: Path, env: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(script)], env={**env, **extra}, capture_output=True, text=True, timeout=60)


def _kdactl(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdactl", *args], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_failing_gate_drains_with_owned_reason_passing_gate_resumes(cluster, env):
    assert _sh(HEALTHCHECK, env).returncode == 0  # real kdactl gate: no certificate in the data dir, exit 1
    state, reason = cluster.show()
    assert "DRAIN" in state and reason.startswith("kdactl: gate failed: no certificate at"), (state, reason)
    assert _sh(HEALTHCHECK, env, FAKE_GATE_RC="0").returncode == 0
    state, reason = cluster.show()
    assert "DRAIN" not in state, (state, reason)


def test_operator_drain_survives_resume_and_a_failing_gate(cluster, env):
    assert cluster.scontrol("update", f"nodename={cluster.node}", "state=drain", "reason=maint by ops").returncode == 0
    res = _kdactl(env, "slurm", "resume", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["result"] == "kept", res.stdout + res.stderr
    _sh(HEALTHCHECK, env, FAKE_GATE_RC="0")
    _sh(HEALTHCHECK, env)  # failing gate: must not take the drain over with a kdactl: reason
    state, reason = cluster.show()
    assert "DRAIN" in state and reason == "maint by ops", (state, reason)


def test_drain_and_resume_commands(cluster, env):
    res = _kdactl(env, "slurm", "drain", "--reason", "sanitizer errors on GPU 3", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert cluster.show()[1] == "kdactl: sanitizer errors on GPU 3"
    res = _kdactl(env, "slurm", "resume", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["result"] == "resumed"
    assert "DRAIN" not in cluster.show()[0]


def test_prolog_drains_on_failing_gate_and_passes_otherwise(cluster, env):
    assert _sh(PROLOG, env, FAKE_GATE_RC="0").returncode == 0
    assert "DRAIN" not in cluster.show()[0]
    assert _sh(PROLOG, env).returncode == 1
    state, reason = cluster.show()
    assert "DRAIN" in state and reason.startswith("kdactl: prolog: gate exit 1: no certificate"), (state, reason)


def test_unknown_node_is_inconclusive(cluster, env):
    res = _kdactl(env, "slurm", "resume", "--node", "no-such-node")
    assert res.returncode == 3 and "scontrol show node no-such-node exited" in res.stderr
