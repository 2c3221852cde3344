"""kdactl k8s labels (NFD feature file). The chart and manifests: tests/test_helm_chart.py; the node loop:
tests/test_k8s_loop.py."""

import json

import pytest
from typer.testing import CliRunner

from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.integrations.k8s import feature_file, labels_command
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

def _labels(tmp_path, cert, now=ff.NOW, **env):
    feat = tmp_path / "features.d"
    feat.mkdir(exist_ok=True)
    rep = labels_command(cf.settings(tmp_path, **env), feat, cert, now=lambda: now)
    return rep, (feat / "kdactl").read_text()


def test_certified_node_labels_with_expiry_directive(tmp_path):
    cert = ff.make_cert(tmp_path, "gpu-a", times=ff.BASELINE_MS)
    rep, text = _labels(tmp_path, cert)
    assert rep.labels == {"kdactl.io/certified": "true", "kdactl.io/kernel-target": "sm_90a", "kdactl.io/cert-expiry": "2026-12-12"}
    lines = text.splitlines()
    assert lines[0] == "# +expiry-time=2026-12-12T12:00:00Z"
    assert "kdactl.io/certified=true" in lines and "kdactl.io/kernel-target=sm_90a" in lines
    assert list((tmp_path / "features.d").iterdir()) == [tmp_path / "features.d" / "kdactl"]  # no temp file left


@pytest.mark.parametrize("case", ["not_certified", "expired", "tampered", "missing", "cpu"])
def test_anything_but_a_valid_certified_certificate_is_false(tmp_path, case):
    cert = {
        "not_certified": lambda: ff.make_cert(tmp_path, "gpu-c", fault="wrong-result:direct"),
        "expired": lambda: ff.make_cert(tmp_path, "gpu-a", when=ff.after(-10)),
        "tampered": lambda: ff.tamper(ff.make_cert(tmp_path, "gpu-c", fault="sanitizer")),
        "missing": lambda: tmp_path / "nope.json",
        "cpu": lambda: ff.DATA / "cpu-inconclusive.json",
    }[case]()
    rep, text = _labels(tmp_path, cert)
    assert rep.labels["kdactl.io/certified"] == "false" and rep.reasons
    assert "kdactl.io/certified=false" in text.splitlines() and "+expiry-time" not in text


def test_feature_file_and_usage(tmp_path):
    assert feature_file({"kdactl.io/certified": "false"}, None).splitlines()[-1] == "kdactl.io/certified=false"
    with pytest.raises(UsageError, match="--features-dir"):
        labels_command(cf.settings(tmp_path), tmp_path / "absent")


def test_cli_labels_json(tmp_path, monkeypatch):
    monkeypatch.setenv("KDACTL_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "f").mkdir()
    res = CliRunner().invoke(app, ["k8s", "labels", "--features-dir", str(tmp_path / "f"), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["labels"] == {"kdactl.io/certified": "false"}
    assert CliRunner().invoke(app, ["k8s", "labels", "--features-dir", str(tmp_path / "none")]).exit_code == 2
