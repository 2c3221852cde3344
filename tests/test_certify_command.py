"""certify end to end with fake node facts and fake stages: verdicts, exit codes, the certificate
written, faults never certified, and the CLI (CliRunner) including the real CPU run (no GPU)."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.results import CheckResult
from tests import certify_fakes as cf


def run(tmp_path, facts=None, runner=None, **opts):
    quick = opts.get("quick", False)
    s = cf.settings(tmp_path, **opts.pop("env", {}))
    return certify_command(s, CertifyOptions(**opts), cf.deps(facts or cf.node(8), runner, quick=quick))


def test_certified_node_writes_a_verifiable_certificate(tmp_path):
    rep = run(tmp_path)
    assert rep.exit_code == 0 and rep.cert["verdict"] == "certified"
    path = tmp_path / "data" / "cert.json"
    doc = json.loads(path.read_text())
    assert doc == rep.cert
    assert cm.check_certificate(doc, None, cf.NOW).ok
    assert doc["schema"] == "kdactl.cert/v1" and doc["scope"] == "full"
    assert doc["issued_at"] == "2026-05-01T12:00:00Z" and doc["expires_at"] == "2026-05-08T12:00:00Z"
    assert set(doc["versions"]) >= {"kdactl", "driver", "cuda_driver", "cuda_toolkit", "torch", "compute_sanitizer"}
    g = doc["gpus"][3]
    assert g == {"index": 3, "uuid": cf.uuid(3), "name": "NVIDIA H200", "sku": "H200", "cc": "9.0", "sm_count": 132,
                 "target": "sm_90a", "artifact_sha256": cf.SHA, "artifact_build": cf.BUILD, "health": cf.HEALTHY.to_json()}
    fpr = doc["node"]["fingerprint"]
    assert fpr["gpu_uuids"] == [cf.uuid(i) for i in range(8)] and fpr["artifact_sha256"] == {"sm_90a": cf.SHA}
    assert fpr["artifact_build"] == {"sm_90a": cf.BUILD}
    assert doc["node"]["hostname"] == "node-a"
    assert all({"check", "gpu", "status", "duration_s", "message"} <= set(r) for r in doc["results"])


def test_node_name_from_the_environment_wins_over_the_hostname(tmp_path):
    """In a pod the hostname is the pod's name; the DaemonSet names the node with KDACTL_NODE_NAME."""
    rep = run(tmp_path, env={"KDACTL_NODE_NAME": "gpu-node-17"})
    assert rep.cert["node"]["hostname"] == "gpu-node-17"


def test_one_bad_gpu_fails_the_node(tmp_path):
    runner = cf.FakeRunner({("sanitize", 6): lambda j: [CheckResult("sanitize.racecheck", "fail", "RACECHECK SUMMARY: 2 errors")]})
    rep = run(tmp_path, runner=runner, expect_gpus=8, expect_sku="H200")
    assert rep.exit_code == 1 and rep.cert["verdict"] == "not_certified"
    assert "gpu6:sanitize.racecheck" in rep.reason


def test_wrong_gpu_count_exits_1(tmp_path):
    rep = run(tmp_path, facts=cf.node(7), expect_gpus=8)
    assert rep.exit_code == 1 and "actual 7 GPUs, expected 8" in rep.reason


def test_subset_of_gpus(tmp_path):
    runner = cf.FakeRunner()
    rep = run(tmp_path, runner=runner, gpus="0,2")
    assert [g["index"] for g in rep.cert["gpus"]] == [0, 2]
    assert {i for _, i in runner.calls} == {0, 2}
    assert rep.cert["node"]["fingerprint"]["gpu_uuids"] == [cf.uuid(i) for i in range(8)]


def test_warn_fails_only_with_fail_on_warn(tmp_path):
    runner = cf.FakeRunner({("perf", 0): lambda j: [CheckResult("perf[B1-T4096-H8-D128]", "warn", "slower within noise")]})
    assert run(tmp_path, runner=runner).exit_code == 0
    assert run(tmp_path, runner=runner, fail_on="warn").exit_code == 1


def test_perf_skipped_for_missing_baseline_is_inconclusive(tmp_path):
    runner = cf.FakeRunner({("perf", None): lambda j: [CheckResult("perf", "skip", "no baseline at fleet/baselines/H200.toml")]})
    rep = run(tmp_path, runner=runner)
    assert rep.exit_code == 3 and "required check skipped (no baseline" in rep.reason


@pytest.mark.parametrize("fault,code", [("wrong-result:direct", 1), ("sanitizer", 1), ("hang", 3), ("crash", 3)])
def test_every_fault_is_never_certified(tmp_path, fault, code):
    rep = run(tmp_path, runner=cf.fault_runner(), env={"KDACTL_FAULT": fault})
    assert rep.exit_code == code and rep.cert["verdict"] != "certified"
    assert rep.cert["options"]["fault"] == fault


def test_fault_on_one_gpu_fails_node_others_pass(tmp_path):
    rep = run(tmp_path, runner=cf.fault_runner(), env={"KDACTL_FAULT": "wrong-result:direct", "KDACTL_FAULT_GPU": "4"})
    assert rep.exit_code == 1
    bad = {r["gpu"] for r in rep.cert["results"] if r["status"] != "pass"}
    assert bad == {4}


def test_uncaught_fault_makes_the_run_inconclusive(tmp_path):
    rep = run(tmp_path, env={"KDACTL_FAULT": "hang"})  # stages that ignore the fault
    assert rep.exit_code == 3 and "no check caught it" in rep.reason


def test_quick_writes_its_own_file(tmp_path):
    rep = run(tmp_path, quick=True)
    assert rep.exit_code == 0 and rep.cert["scope"] == "quick"
    assert (tmp_path / "data" / "cert-quick.json").is_file() and not (tmp_path / "data" / "cert.json").exists()


def test_out_junit_prom_and_signature(tmp_path):
    out, junit, prom = tmp_path / "o" / "c.json", tmp_path / "j.xml", tmp_path / "p.prom"
    rep = run(tmp_path, out=out, junit=junit, prom=prom, lifetime_days=1.5, env={"KDACTL_CERT_KEY": "s3cret"})
    doc = json.loads(out.read_text())
    assert doc["integrity"]["signature"]["algorithm"] == "hmac-sha256"
    assert cm.check_certificate(doc, b"s3cret", cf.NOW).ok
    assert doc["expires_at"] == "2026-05-03T00:00:00Z"
    assert junit.read_text().startswith("<?xml") and "kdactl_certified" in prom.read_text()
    assert rep.paths == {"certificate": str(out), "junit": str(junit), "prom": str(prom), "logs": None}


@pytest.mark.parametrize("opts,match", [
    ({"gpus": "x"}, "--gpus"), ({"expect_gpus": 0}, "--expect-gpus"), ({"expect_sku": "H300"}, "--expect-sku"),
    ({"fail_on": "error"}, "--fail-on"), ({"lifetime_days": 0}, "--lifetime"), ({"gpus": "9"}, "no GPU 9"),
])  # fmt: skip
def test_usage_errors(tmp_path, opts, match):
    with pytest.raises(UsageError, match=match):
        run(tmp_path, **opts)


@pytest.mark.parametrize("value", ["garbage", "wrong-result:nosuch", "hang:5"])
def test_unknown_fault_is_a_usage_error_and_writes_nothing(tmp_path, value):
    runner = cf.FakeRunner()
    with pytest.raises(UsageError, match=f"KDACTL_FAULT='{value}'.*valid values: wrong-result:direct, .*slow"):
        run(tmp_path, runner=runner, env={"KDACTL_FAULT": value})
    assert runner.calls == [] and not (tmp_path / "data" / "cert.json").exists()


def test_cli_unknown_fault_exits_2_naming_it(tmp_path):
    res = CliRunner().invoke(app, ["certify", "--json"], env={**_cli_env(tmp_path), "KDACTL_FAULT": "garbage"})
    assert res.exit_code == 2, res.output
    error = json.loads(res.stdout)["error"]
    assert "'garbage'" in error and "sanitizer, hang, crash, busy, slow" in error
    assert not (tmp_path / "data" / "cert.json").exists()


def test_no_gpu_node_is_inconclusive_with_certificate(tmp_path):
    rep = run(tmp_path, facts=cf.no_gpu_node(), expect_gpus=8)
    assert rep.exit_code == 3 and rep.cert["verdict"] == "inconclusive"
    assert "no NVIDIA driver" in rep.cert["reason"] and rep.cert["gpus"] == []


# --- CLI -------------------------------------------------------------------------------------


def _cli_env(tmp_path):
    return {"KDACTL_DATA_DIR": str(tmp_path / "data"), "KDACTL_CACHE_DIR": str(tmp_path / "cache"), "KDACTL_CERT_KEY": ""}


def test_cli_certify_on_this_cpu_machine_is_inconclusive_and_writes_cert(tmp_path, monkeypatch):
    import kdactl.node as node_mod

    monkeypatch.setattr(node_mod, "gather_node", lambda s, p=None: cf.no_gpu_node())
    res = CliRunner().invoke(app, ["certify", "--json", "--junit", str(tmp_path / "j.xml")], env=_cli_env(tmp_path))
    assert res.exit_code == 3, res.output
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "inconclusive" and doc["exit_code"] == 3
    cert = json.loads((tmp_path / "data" / "cert.json").read_text())
    assert cm.check_certificate(cert, None, cm.now_utc()).ok and "no NVIDIA driver" in cert["reason"]
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "data" / "cert.json")], env=_cli_env(tmp_path))
    assert res.exit_code == 0, res.output


def test_cli_usage_exit_2(tmp_path):
    res = CliRunner().invoke(app, ["certify", "--gpus", "zero", "--json"], env=_cli_env(tmp_path))
    assert res.exit_code == 2 and "--gpus" in json.loads(res.stdout)["error"]


def test_cli_help_lists_options():
    res = CliRunner().invoke(app, ["certify", "--help"])
    assert res.exit_code == 0
    for opt in ("--gpus", "--expect-gpus", "--expect-sku", "--quick", "--out", "--junit", "--prom", "--lifetime", "--fail-on", "--json"):
        assert opt in res.stdout


def _driver_present() -> bool:
    from kdactl.errors import KdactlError
    from kdactl.hw.nvml import PynvmlDriver

    try:
        return bool(PynvmlDriver().read().gpus)
    except KdactlError:
        return False


@pytest.mark.skipif(_driver_present(), reason="this node has a GPU: the real certify would run the whole suite")
def test_cli_real_certify_without_gpu(tmp_path):
    res = CliRunner().invoke(app, ["certify", "--json"], env=_cli_env(tmp_path))
    assert res.exit_code == 3, res.output
    cert = json.loads((tmp_path / "data" / "cert.json").read_text())
    assert cert["verdict"] == "inconclusive" and cm.check_certificate(cert, None, cm.now_utc()).ok
    assert json.loads(res.stdout)["certificate"] == cert


# --- outputs: checked before the run, published all or none; bounded worker logs; Ctrl-C -------


def test_unwritable_output_is_a_usage_error_before_the_node_is_touched(tmp_path):
    out = tmp_path / "data" / "cert.json"
    run(tmp_path)
    old = out.read_text()
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    runner = cf.FakeRunner()
    try:
        for opts, match in (({"prom": locked / "kdactl.prom"}, "--prom"), ({"junit": tmp_path}, "--junit"),
                            ({"junit": out}, "--out and --junit both name")):  # fmt: skip
            if opts.get("prom") and os.access(locked, os.W_OK):
                continue  # root writes anywhere: this case cannot be made here
            with pytest.raises(UsageError, match=match):
                run(tmp_path, runner=runner, **opts)
    finally:
        locked.chmod(0o700)
    assert runner.calls == [] and out.read_text() == old


def test_outputs_are_published_all_or_none(tmp_path, monkeypatch):
    """The certificate is not replaced when a later output cannot be written (disk full, say)."""
    import kdactl.atomic as atomic

    out, junit, prom = tmp_path / "data" / "cert.json", tmp_path / "j.xml", tmp_path / "p.prom"
    run(tmp_path, junit=junit, prom=prom)
    before = {p: p.read_text() for p in (out, junit, prom)}
    real_stage = atomic._stage

    def stage(path, text, mode):
        if path.suffix == ".prom":
            raise OSError(28, "No space left on device", str(path))
        return real_stage(path, text, mode)

    monkeypatch.setattr(atomic, "_stage", stage)
    with pytest.raises(UsageError, match="No space left.*no output was changed"):
        run(tmp_path, junit=junit, prom=prom, facts=cf.node(7), expect_gpus=8)
    assert {p: p.read_text() for p in before} == before
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no staged file left behind


def test_worker_logs_are_bounded_and_named_in_the_output(tmp_path, monkeypatch):
    from kdactl.certify import command

    class LoggingRunner(cf.FakeRunner):  # stands in for SubprocessRunner, which writes into log_dir
        def __init__(self, log_dir, **kw):
            super().__init__()
            (log_dir / "gpu0-suite.log").write_text("ok\n")

    monkeypatch.setattr(command, "SubprocessRunner", LoggingRunner)
    s = cf.settings(tmp_path)
    paths = []
    for _ in range(command.KEEP_LOG_DIRS + 3):
        paths.append(certify_command(s, CertifyOptions(), _no_runner(cf.deps(cf.node(1)))).paths["logs"])
    kept = sorted(p.name for p in (tmp_path / "data").glob(f"{command.LOG_PREFIX}*"))
    assert len(kept) == command.KEEP_LOG_DIRS and Path(paths[-1]).name in kept and Path(paths[0]).name not in kept
    from rich.console import Console

    console = Console(record=True, width=300)
    certify_command(s, CertifyOptions(), _no_runner(cf.deps(cf.node(1)))).render(console)
    assert command.LOG_PREFIX in console.export_text()


def _no_runner(deps):
    deps.runner = None
    return deps


def test_ctrl_c_ends_as_3_interrupted_and_keeps_the_old_certificate(tmp_path, monkeypatch):
    from kdactl.certify import command

    env = _cli_env(tmp_path)
    out = tmp_path / "data" / "cert.json"
    run(tmp_path)
    old = out.read_text()
    cancelled = []

    class CtrlC(cf.FakeRunner):
        def run(self, spec, job):
            if spec.name == "suite":
                raise KeyboardInterrupt
            return super().run(spec, job)

        def cancel(self):
            cancelled.append(True)

    real = command.certify_command
    monkeypatch.setattr(command, "certify_command", lambda s, o: real(s, o, cf.deps(cf.node(2), CtrlC())))
    for args in (["certify"], ["certify", "--json"]):
        res = CliRunner().invoke(app, args, env=env)
        assert res.exit_code == 3 and res.stderr.strip() == "kdactl: interrupted", res.output
        assert out.read_text() == old
    assert json.loads(res.stdout) == {"command": "certify", "exit_code": 3, "error": "interrupted"}
    assert cancelled, "the running workers were not stopped"
