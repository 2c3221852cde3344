"""kdactl gate: certificate checks, the node fingerprint comparison, exit codes, no torch (its start-up:
tests/test_gate_startup.py; its time: tools/bench_gate.py)."""

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.certify import fingerprint as fp
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.gate import gate_command
from kdactl.cli import app
from kdactl.errors import NoGpu
from tests import certify_fakes as cf

NOW_NODE = fp.NodeNow(tuple(cf.uuid(i) for i in range(8)), ((9, 0),) * 8, "580.159.04", (13, 0))


def certify(tmp_path, **opts):
    env = opts.pop("env", {})
    s = cf.settings(tmp_path, **env)
    rep = certify_command(s, CertifyOptions(**opts), cf.deps(cf.node(8), quick=opts.get("quick", False)))
    return s, rep


def gate(s, node=NOW_NODE, arts=None, now=cf.NOW + timedelta(hours=1), cert=None):
    def reader(_):
        if isinstance(node, Exception):
            raise node
        return node

    art = arts if arts is not None else {"sm_90a": cf.ARTIFACT}
    return gate_command(s, cert, None, now=lambda: now, node_reader=reader,
                        artifacts=lambda settings, targets: ({t: art.get(t) for t in targets}, {t: "not in the cache" for t in targets if art.get(t) is None}))  # fmt: skip


def test_pass(tmp_path):
    s, _ = certify(tmp_path)
    rep = gate(s)
    assert rep.exit_code == 0 and rep.failures == [] and rep.unknown == []
    assert "certified" in rep.summary


def _node(**kw):
    from dataclasses import replace

    return replace(NOW_NODE, **kw)


@pytest.mark.parametrize("node,arts,want", [
    (_node(gpu_uuids=NOW_NODE.gpu_uuids[:2] + ("GPU-new",) + NOW_NODE.gpu_uuids[3:]), None,
     f"GPU 2: uuid {cf.uuid(2)} at certification, GPU-new now"),
    (_node(gpu_uuids=NOW_NODE.gpu_uuids[:7], ccs=((9, 0),) * 7), None, f"GPU count changed: 8 at certification, 7 now (gone: {cf.uuid(7)})"),
    (_node(driver_version="590.10"), None, "driver changed: 580.159.04 at certification, 590.10 now"),
    (_node(toolkit=(13, 1)), None, "CUDA toolkit (nvcc) changed: 13.0 at certification, 13.1 now"),
    (NOW_NODE, {"sm_90a": fp.Artifact(cf.SHA, "cd" * 32)}, "kernel library sm_90a changed: build inputs efefefefefefefef... "
     "at certification, cdcdcdcdcdcdcdcd... now (other sources, flags, kdactl or nvcc)"),
    (NOW_NODE, {"sm_90a": None}, "kernel library sm_90a: build inputs efefefefefefefef... at certification, no valid library now (not in the cache)"),
])  # fmt: skip
def test_fingerprint_change_fails_with_reason(tmp_path, node, arts, want):
    s, _ = certify(tmp_path)
    rep = gate(s, node=node, arts=arts)
    assert rep.exit_code == 1 and want in rep.failures, rep.failures


def test_new_gpu_not_covered(tmp_path):
    s, _ = certify(tmp_path, gpus="0,1")
    rep = gate(s)
    assert rep.exit_code == 1 and f"GPU 2 ({cf.uuid(2)}) is not covered by the certificate" in rep.failures


def test_no_certificate_is_fail(tmp_path):
    rep = gate(cf.settings(tmp_path))
    assert rep.exit_code == 1 and "no certificate" in rep.failures[0]


def test_not_certified_quick_expired_tampered(tmp_path):
    s, _ = certify(tmp_path, expect_gpus=9)
    assert "verdict is not_certified: inventory.count: actual 8 GPUs, expected 9" in gate(s).failures
    s, rep = certify(tmp_path / "q", quick=True)
    assert any("scope is 'quick'" in f for f in gate(s, cert=tmp_path / "q" / "data" / "cert-quick.json").failures)
    s, _ = certify(tmp_path / "e", lifetime_days=1)
    assert gate(s, now=cf.NOW + timedelta(days=2)).failures[0].startswith("expired")
    path = s.data_dir / "cert.json"
    path.write_text(path.read_text().replace('"sm_90a"', '"sm_100f"', 1))
    assert any("digest mismatch" in f for f in gate(s).failures)


def test_cannot_read_node_is_3(tmp_path):
    s, _ = certify(tmp_path)
    rep = gate(s, node=NoGpu("no NVIDIA driver: NVML init failed"))
    assert rep.exit_code == 3 and "cannot read the node now" in rep.unknown[0]


def test_signed_cert_needs_key(tmp_path):
    s, _ = certify(tmp_path, env={"KDACTL_CERT_KEY": "k"})
    assert gate(s).exit_code == 0
    s2 = cf.settings(tmp_path)  # same data dir, no key configured
    assert gate(s2).exit_code == 3
    s3 = cf.settings(tmp_path, KDACTL_CERT_KEY="other")
    assert gate(s3).exit_code == 1


def test_find_artifact_reads_the_verified_cache_entry(tmp_path):
    from kdactl.jit import cache
    from kdactl.jit.spec import kernel_library_spec
    from kdactl.targets import get_target

    s = cf.settings(tmp_path)
    assert fp.find_artifact(s, "sm_90a")[0] is None
    spec = kernel_library_spec(get_target("sm_90a"))
    key = spec.key_dir(s.cache_dir)
    key.mkdir(parents=True)
    (key / "libkdactl.so").write_bytes(b"\x7fELF fake library")
    sha = cache.sha256_file(key / "libkdactl.so")
    manifest = {"schema": cache.MANIFEST_SCHEMA, "target": "sm_90a", "source_hash": spec.source_hash(),
                "library": "libkdactl.so", "files": {"libkdactl.so": sha}, "nvcc": {"version": "13.0", "banner": "Build cuda_13.0"}}  # fmt: skip
    (key / "manifest.json").write_text(json.dumps(manifest))
    assert fp.find_artifact(s, "sm_90a") == (fp.Artifact(sha, cache.build_key(manifest)), "")
    (key / "libkdactl.so").write_bytes(b"\x7fELF tampered")
    found, why = fp.find_artifact(s, "sm_90a")
    assert found is None and "does not match" in why
    (key / "libkdactl.so").write_bytes(b"\x7fELF fake library")
    del manifest["nvcc"]
    (key / "manifest.json").write_text(json.dumps(manifest))
    found, why = fp.find_artifact(s, "sm_90a")
    assert found is None and "manifest lacks source_hash, target or nvcc" in why


def test_node_targets():
    s = cf.settings(__import__("pathlib").Path("/nonexistent"))
    assert fp.node_targets(s, [(9, 0)], (13, 0), {"sm_80"}) == {"sm_90a"}
    assert fp.node_targets(s, [(9, 0)], None, {"sm_90a"}) == {"sm_90a"}
    assert fp.node_targets(cf.settings(__import__("pathlib").Path("/x"), KDACTL_CUDA_ARCH="sm_80"), [(9, 0)], (13, 0), ()) == {"sm_80"}


def test_cli_json_and_lines(tmp_path):
    env = {"KDACTL_DATA_DIR": str(tmp_path / "none"), "KDACTL_CERT_KEY": ""}
    r = CliRunner().invoke(app, ["gate", "--json"], env=env)
    assert r.exit_code == 1 and json.loads(r.stdout)["result"] == "fail"
    r = CliRunner().invoke(app, ["gate"], env=env)
    assert r.exit_code == 1 and r.stdout.startswith("FAIL: no certificate at ")


def _fresh_cert(tmp_path):
    now = cm.now_utc()
    s, _ = certify(tmp_path, env={})
    doc = json.loads((s.data_dir / "cert.json").read_text())
    doc.update(issued_at=cm.stamp(now), expires_at=cm.stamp(now + timedelta(days=1)))
    cm.write_certificate(s.data_dir / "cert.json", cm.seal(doc, None))
    return s


def test_gate_never_imports_torch(tmp_path):
    s = _fresh_cert(tmp_path)
    code = f"""
import sys
from pathlib import Path
from kdactl.cli import app
from kdactl.certify.gate import gate_command
from kdactl.certify import fingerprint as fp
from kdactl.settings import Settings
s = Settings.from_env({{"HOME": {str(tmp_path)!r}, "KDACTL_DATA_DIR": {str(s.data_dir)!r}, "KDACTL_CACHE_DIR": {str(s.cache_dir)!r}}})
node = fp.NodeNow(({cf.uuid(0)!r},), ((9, 0),), "580.159.04", (13, 0))
rep = gate_command(s, node_reader=lambda _: node)          # the real artifact lookup (spec, cache)
assert any("kernel library sm_90a" in f for f in rep.failures), rep.failures
try:
    fp.read_node_now(s)                                     # the real NVML read
except Exception:
    pass
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=cf.ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_inconclusive_certificate_is_3_not_1(tmp_path):
    """SPEC: an inconclusive certificate is no evidence against the node; the gate cannot tell (3)."""
    s = cf.settings(tmp_path)
    runner = cf.FakeRunner({("perf", None): lambda j: [cf.CheckResult("perf", "error", "GPU busy: 6 other processes")]})
    certify_command(s, CertifyOptions(), cf.deps(cf.node(8), runner))
    rep = gate(s)
    assert rep.exit_code == 3 and rep.failures == [] and rep.unknown[0].startswith("verdict is inconclusive")
    assert "GPU busy" in rep.unknown[0]
    late = gate(s, now=cf.NOW + timedelta(days=8))  # evidence against it still wins: expired is 1

    assert late.exit_code == 1 and late.failures[0].startswith("expired")


@pytest.mark.parametrize("where, value, problem", cf.WRONG_TYPES)
def test_sealed_wrong_type_fails_the_gate_not_internal_error(tmp_path, where, value, problem):
    s, _ = certify(tmp_path)
    cf.reseal_changed(s.data_dir / "cert.json", where, value)
    rep = gate(s)
    assert rep.exit_code == 1 and f"invalid certificate (kdactl.cert/v1): {problem}" in rep.failures, rep.failures


@pytest.mark.parametrize("token, problem", cf.BAD_TOKENS)
def test_non_finite_numbers_and_deep_nesting_fail_the_gate(tmp_path, token, problem):
    s, _ = certify(tmp_path)
    cf.reseal_changed(s.data_dir / "cert.json", token=token)
    rep = gate(s)
    assert rep.exit_code == 1 and len(rep.failures) == 1 and problem in rep.failures[0], rep.failures
    env = {"KDACTL_DATA_DIR": str(s.data_dir), "KDACTL_CACHE_DIR": str(s.cache_dir), "KDACTL_CERT_KEY": ""}
    r = CliRunner().invoke(app, ["gate", "--json"], env=env)
    assert r.exit_code == 1 and json.loads(r.stdout)["result"] == "fail" and problem in r.stdout, r.output


def test_an_invalid_inconclusive_certificate_is_1_not_3(tmp_path):
    """An invalid document's verdict means nothing: 'inconclusive' in it does not make the gate say 3."""
    s = cf.settings(tmp_path)
    certify_command(s, CertifyOptions(), cf.deps(cf.no_gpu_node()))
    cf.reseal_changed(s.data_dir / "cert.json", ("node", "hostname"), ["vm"])
    rep = gate(s)
    assert rep.exit_code == 1 and rep.unknown == [] and rep.failures == [
        "invalid certificate (kdactl.cert/v1): node.hostname is a list, expected a string"]
