"""fleet/prometheus: the textfile passes promtool's own check, its series are bounded by the node
(not by the number of checks), the documented metrics are the ones written, and the alert rules
pass promtool's rule check and their unit tests (alerts_test.yaml)."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.outputs import prom_text
from kdactl.results import CheckResult
from tests import certify_fakes as cf
from tests import fleet_fakes as ff
from tests.test_cert_outputs import mixed_runner
from tests.tools import require_tool

DIR = Path(__file__).resolve().parents[1] / "fleet" / "prometheus"
SHAPES_MS = {"B1-T4096-H8-D128": 0.122028, "B2-T1024-H16-D128": 0.075198, "varlen(17,300,1000)-H4-D128": 0.054384}


@pytest.fixture(scope="module")
def promtool():
    return require_tool("promtool", "Debian package prometheus; .ci/run installs it")


def node_cert(tmp_path, gpus=8, suite_checks=130, extra=()):
    """An 8-GPU H200 node through the real certify pipeline: ``suite_checks`` passing suite checks per
    GPU (a real suite runs about that many), the H200 baseline's three perf shapes, ``extra`` results."""
    def suite(job):
        return [CheckResult(f"test_routes.py::test_route[{i}]", "pass", "", 0.1) for i in range(suite_checks)] + list(extra)

    def perf(job):
        return [CheckResult(f"perf[{shape}]", "pass", f"measured {ms} ms", perf={"shape": shape, "measured": ms,
                            "baseline": ms, "threshold": ms * 1.1, "unit": "ms", "timer": "kineto"}) for shape, ms in SHAPES_MS.items()]  # fmt: skip

    runner = cf.FakeRunner({("suite", None): suite, ("perf", None): perf})
    s = cf.settings(tmp_path)
    return certify_command(s, CertifyOptions(), cf.deps(cf.node(gpus), runner)).cert


def series(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_textfile_passes_promtool_check_metrics(tmp_path, promtool):
    for doc in (node_cert(tmp_path / "a"), cf_mixed(tmp_path / "b")):
        text = prom_text(doc)
        proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def cf_mixed(tmp_path):
    s = cf.settings(tmp_path)
    return certify_command(s, CertifyOptions(), cf.deps(cf.node(3), mixed_runner())).cert


def test_series_are_bounded_by_the_node_not_the_suite(tmp_path):
    """8 GPUs: 12 node series (info, certified, 3 verdicts, issued, expiry, 5 status counts) and one per
    GPU and gated shape (8 x 3); passing checks add none, each failing or warning check adds one."""
    big = series(prom_text(node_cert(tmp_path / "big", suite_checks=130)))
    small = series(prom_text(node_cert(tmp_path / "small", suite_checks=5)))
    assert len(big) == len(small) == 12 + 8 * 3
    warned = prom_text(node_cert(tmp_path / "warn", extra=[CheckResult("perf.throttle", "warn", "power cap")]))
    assert len(series(warned)) == 36 + 8
    assert warned.count('check="perf.throttle"') == 8
    assert re.search(r'^kdactl_check_results\{node="node-a",status="pass"\} (\d+)$', warned, re.M)


def test_info_metric_and_base_units(tmp_path):
    text = prom_text(node_cert(tmp_path, suite_checks=1))
    assert 'kdactl_info{node="node-a",version="0.1.0",verdict="certified",scope="full",sku="H200",target="sm_90a",driver="580.159.04"} 1' in text
    assert f'kdactl_perf_measured_seconds{{node="node-a",gpu_uuid="{cf.uuid(7)}",shape="B1-T4096-H8-D128"}} 0.000122028\n' in text
    assert "_ms" not in text


def test_documented_metrics_match_what_certify_writes(tmp_path):
    documented = set(re.findall(r"^\| `(kdactl_[a-z_]+)` \|", (DIR / "README.md").read_text(), re.M))
    doc = json.loads(ff.make_cert(tmp_path, "gpu-a").read_text())
    assert documented == set(re.findall(r"^# TYPE (\S+) gauge$", prom_text(doc), re.M))


def test_alert_rules_use_written_metrics(tmp_path):
    rules = yaml.safe_load((DIR / "alerts.yaml").read_text())["groups"][0]["rules"]
    doc = json.loads(ff.make_cert(tmp_path, "gpu-a").read_text())
    written = set(re.findall(r"^# TYPE (\S+) gauge$", prom_text(doc), re.M))
    for r in rules:
        used = set(re.findall(r"\bkdactl_[a-z_]+", r["expr"]))
        assert used and used <= written, (r["alert"], used - written)


def test_alert_rules_pass_promtool_check_rules(promtool):
    proc = subprocess.run([promtool, "check", "rules", "alerts.yaml"], cwd=DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS: 5 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_alert_rules_pass_their_promtool_unit_tests(promtool):
    """ExpiringSoon renders the time left (7h 48m 0s); a certified node whose DCGM series come from another
    scrape target than node_exporter's is not 'without certificate'."""
    proc = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=DIR, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", (DIR / "alerts_test.yaml").read_text()))
    rules = {r["alert"] for r in yaml.safe_load((DIR / "alerts.yaml").read_text())["groups"][0]["rules"]}
    assert tested == rules
