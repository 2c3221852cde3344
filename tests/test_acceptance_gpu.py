"""GPU acceptance: the certify pipeline end to end on this GPU node, run as an operator runs it (the
`kdactl` CLI in a child process), each planted fault caught by the stage it targets.

    python3 -m pytest -q tests/test_acceptance_gpu.py     # minutes: every certify here is a real run

What it runs: certify on the healthy node (exit 0, a certificate `kdactl verify` and `kdactl gate`
accept, one changed byte refused); every KDACTL_FAULT value, judged by kdactl.certify.fault_catch
(the verdict, and the failing checks in the fault's own stage): most through `certify --quick`,
all at once, and busy, slow and a wrong small_bh result through the full certify, one at a time; a
SIGINT to a running certify (exit 3 "interrupted", the old certificate byte for byte, no process of
the run left); and the perf gate against a baseline twice as fast as the node (exit 1).

Certificates and logs go to a temporary data dir; the kernel cache is the environment's
(KDACTL_CACHE_DIR or the default), so a warm cache is reused. The healthy run needs the SKU's
baseline (fleet/baselines/<SKU>.toml): without one the node cannot be certified, and the tests that
need it skip, naming the command that records it. Skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kdactl.certify.fault_catch import catch_for, catch_problems
from kdactl.results import VERDICT_EXIT, CheckResult

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]

KDACTL = [sys.executable, "-m", "kdactl"]  # this checkout's CLI, in this interpreter
# --quick's suite smokes only its first row (T = 8), where small_bh is never eligible: a wrong small_bh
# result reaches the quick run only through the sanitizer payload, so the full suite's small_bh row
# judges that fault; busy and slow need the perf stage, which --quick does not run.
FULL_FAULTS = ["wrong-result:small_bh", "busy", "slow"]
QUICK_FAULTS = ["wrong-result:direct", "wrong-result:chunk", "sanitizer", "hang", "crash"]
FAULT_VARS = ("KDACTL_FAULT", "KDACTL_FAULT_GPU")
RUN_MARK = "KDACTL_ACCEPTANCE_RUN"  # set in one run's environment: every process of that run carries it


@dataclass(frozen=True)
class Run:
    rc: int
    stdout: str
    stderr: str
    cert: dict | None  # the certificate written, when there is one

    def results(self) -> list[CheckResult]:
        return [CheckResult.from_json(r) for r in (self.cert or {}).get("results", [])]

    def said(self) -> str:
        return f"rc {self.rc}; stderr tail: {self.stderr[-1500:]}"


def kdactl(args: list[str], env: dict[str, str], timeout_s: float, out: Path | None = None) -> Run:
    proc = subprocess.run([*KDACTL, *args], env=env, capture_output=True, text=True, timeout=timeout_s)
    cert = json.loads(out.read_text()) if out is not None and out.is_file() else None
    return Run(proc.returncode, proc.stdout, proc.stderr, cert)


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FAULT_VARS}
    env.update(KDACTL_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="session")
def node() -> dict:
    """This node as `kdactl detect --json` sees it: its GPU count and (one) SKU."""
    proc = subprocess.run([*KDACTL, "detect", "--json"], capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout)
    skus = {g["sku"] for g in doc["gpus"]}
    assert doc["gpus"] and len(skus) == 1, f"detect: {doc.get('error')}; SKUs {skus}"
    return {"gpus": len(doc["gpus"]), "sku": skus.pop()}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kdactl-data")


@pytest.fixture(scope="session")
def healthy(node, data_dir) -> Run:
    """The full certify of the node with no fault, with every output an operator asks for."""
    from kdactl.bench.baseline import default_path

    if not default_path(node["sku"]).is_file():
        pytest.skip(f"no baseline for {node['sku']} ({default_path(node['sku'])}): record one on a known good node "
                    "with 'kdactl bench --suite smoke --peers none --record-baseline'")  # fmt: skip
    out = data_dir / "cert.json"
    args = ["certify", "--expect-gpus", str(node["gpus"]), "--expect-sku", node["sku"], "--out", str(out),
            "--junit", str(data_dir / "certify.xml"), "--prom", str(data_dir / "kdactl.prom"), "--json"]  # fmt: skip
    return kdactl(args, clean_env(data_dir), 900, out)


def test_certify_passes_a_healthy_node(healthy, data_dir):
    assert healthy.rc == 0, healthy.said()
    assert json.loads(healthy.stdout)["verdict"] == "certified"  # --json: exactly one document on stdout
    cert = healthy.cert
    assert cert is not None and cert["verdict"] == "certified" and cert["scope"] == "full"
    assert not [r for r in healthy.results() if r.status in ("fail", "error")]
    assert {r.check for r in healthy.results()} >= {"build", "selftest", "sanitize.memcheck", "perf.activity"}
    assert (data_dir / "certify.xml").is_file() and (data_dir / "kdactl.prom").is_file()
    env = clean_env(data_dir)
    verify = kdactl(["verify", str(data_dir / "cert.json")], env, 120)
    assert verify.rc == 0, verify.said()
    gate = kdactl(["gate"], env, 120)  # the default certificate: $KDACTL_DATA_DIR/cert.json
    assert gate.rc == 0, gate.said()


def test_verify_refuses_a_changed_certificate(healthy, data_dir, tmp_path):
    assert healthy.cert is not None
    doc = dict(healthy.cert)
    doc["node"] = {**doc["node"], "hostname": doc["node"]["hostname"] + "x"}  # one byte more, not sealed again
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(doc))
    assert kdactl(["verify", str(changed)], clean_env(data_dir), 120).rc == 1


@pytest.fixture(scope="session")
def quick_fault_runs(tmp_path_factory) -> dict[str, Run]:
    """`KDACTL_FAULT=<f> kdactl certify --quick` for the QUICK_FAULTS, all at once (one GPU takes them
    side by side), each with its own data dir."""

    def one(fault: str) -> Run:
        folder = tmp_path_factory.mktemp("fault-" + fault.replace(":", "-"))
        out = folder / "cert.json"
        return kdactl(
            ["certify", "--quick", "--out", str(out), "--json"], clean_env(folder, KDACTL_FAULT=fault), 600, out
        )

    with ThreadPoolExecutor(len(QUICK_FAULTS)) as pool:
        return dict(zip(QUICK_FAULTS, pool.map(one, QUICK_FAULTS)))


def assert_caught(fault: str, run: Run) -> None:
    catch, _ = catch_for(fault)
    assert run.cert is not None, f"no certificate: {run.said()}"
    assert run.cert["options"]["fault"] == fault
    assert catch_problems(fault, run.results()) == [], run.said()
    assert run.rc == VERDICT_EXIT[catch.verdict], run.said()


@pytest.mark.parametrize("fault", QUICK_FAULTS)
def test_quick_certify_catches_the_fault_in_its_stage(quick_fault_runs, fault):
    assert_caught(fault, quick_fault_runs[fault])


@pytest.mark.parametrize("fault", FULL_FAULTS)
def test_full_certify_catches_the_fault_in_its_stage(node, tmp_path, fault):
    """One at a time (the perf stage needs the GPU alone): busy (a co-tenant while perf times) is
    inconclusive; slow (every call launched twice) must fail the perf gate, not a route smoke; a wrong
    small_bh result fails the suite's small_bh smokes."""
    from kdactl.bench.baseline import default_path

    if not default_path(node["sku"]).is_file():
        pytest.skip(f"no baseline for {node['sku']}: the perf stage cannot judge this node")
    out = tmp_path / "cert.json"
    args = ["certify", "--expect-gpus", str(node["gpus"]), "--expect-sku", node["sku"], "--out", str(out), "--json"]
    assert_caught(fault, kdactl(args, clean_env(tmp_path, KDACTL_FAULT=fault), 900, out))


def marked_pids(mark: str) -> list[int]:
    """Processes (of this user) whose environment carries RUN_MARK=mark."""
    needle = f"{RUN_MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ctrl_c_ends_certify_as_3_and_keeps_the_old_certificate(healthy, node, data_dir, tmp_path):
    """SIGINT to the kdactl process alone (not its process group), once its stages run."""
    assert healthy.cert is not None
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    keep = out_dir / "keep.json"
    shutil.copy(data_dir / "cert.json", keep)
    before = keep.read_bytes()
    mark = uuid.uuid4().hex
    env = clean_env(tmp_path / "data", **{RUN_MARK: mark})
    proc = subprocess.Popen([*KDACTL, "certify", "--expect-gpus", str(node["gpus"]), "--out", str(keep)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    lines: list[str] = []
    suite_started = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if re.search(r"gpu\d+ suite \.\.\.", line):
                suite_started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert suite_started.wait(600), "certify never started its suite stage: " + " | ".join(lines[-10:])
        time.sleep(5)  # the suite's pytest and the sanitizers are running now
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    assert rc == 3, "\n".join(lines[-10:])
    assert "interrupted" in lines[-1]
    assert keep.read_bytes() == before  # the old certificate, byte for byte
    assert sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("certify-logs-")) == ["keep.json"]
    deadline = time.monotonic() + 10
    while marked_pids(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marked_pids(mark) == [], "processes of the interrupted run are still alive"


def test_perf_gate_fails_a_node_slower_than_its_baseline(tmp_path):
    """The gate's control: a baseline recorded here, then halved, must fail (the recorded baseline goes
    to a temporary file, never over fleet/baselines/)."""
    env = clean_env(tmp_path)
    recorded, fast = tmp_path / "recorded.toml", tmp_path / "fast.toml"
    bench = ["bench", "--suite", "smoke", "--peers", "none", "--iters", "8"]
    rec = kdactl([*bench, "--record-baseline", "--baseline", str(recorded)], env, 600)
    assert rec.rc == 0 and recorded.is_file(), rec.said()
    halved = re.sub(r"median_ms = ([0-9.eE+-]+)", lambda m: f"median_ms = {float(m[1]) / 2!r}", recorded.read_text())
    assert halved != recorded.read_text()
    fast.write_text(halved)
    gate = kdactl([*bench, "--gate", "--baseline", str(fast)], env, 600)
    assert gate.rc == 1, gate.said()
