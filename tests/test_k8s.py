"""kdactl k8s labels (NFD feature file) and the manifests in fleet/k8s."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.integrations.k8s import feature_file, labels_command
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

ROOT = Path(__file__).resolve().parents[1]


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


# --- manifests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests():
    docs = [d for d in yaml.safe_load_all((ROOT / "fleet" / "k8s" / "kdactl-daemonset.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_daemonset_certifies_tainted_gpu_nodes(manifests):
    ds = manifests["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"] == ds["spec"]["template"]["metadata"]["labels"]
    assert {"key": "kdactl.io/uncertified", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    c = spec["containers"][0]
    script = "\n".join(c["args"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "kdactl certify" in script and 'kdactl k8s labels --features-dir "$FEATURES_DIR"' in script
    assert 'kubectl taint nodes "$NODE_NAME" "$TAINT:NoSchedule-"' in script and env["TAINT"] == "kdactl.io/uncertified"
    assert script.index("kdactl certify") < script.index('if [ "$rc" -eq 0 ]') < script.index("kubectl taint")
    assert c["readinessProbe"]["exec"]["command"] == ["kdactl", "gate"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {env["KDACTL_DATA_DIR"], env["FEATURES_DIR"]} <= mounts
    assert {v["name"] for v in spec["volumes"]} == {m["name"] for m in c["volumeMounts"]}


def test_rbac_lets_the_pod_patch_its_node(manifests):
    sa, role, binding = manifests["ServiceAccount"], manifests["ClusterRole"], manifests["ClusterRoleBinding"]
    assert any("nodes" in r["resources"] and "patch" in r["verbs"] for r in role["rules"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    assert manifests["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert manifests["DaemonSet"]["metadata"]["namespace"] == sa["metadata"]["namespace"] == manifests["Namespace"]["metadata"]["name"]
