"""fleet/helm/kdactl through Helm's own engine (helm-python-sdk: Helm's Go SDK as a library, offline):
helm lint, the rendered objects against the Kubernetes OpenAPI schemas (kubernetes-validate), the
values schema and the renewal rule, and the plain manifest in fleet/k8s being the chart's render."""

import pytest
import yaml

from tests import certify_fakes as cf
from tests.tools import require_module

CHART = cf.ROOT / "fleet" / "helm" / "kdactl"
KUBE_VERSIONS = ("1.25.0", "1.37.0")  # the chart's kubeVersion floor and the newest schemas kubernetes-validate ships
HOW = "the test extra: pip install -e '.[test]'"
SIGNING = {"signing": {"keyHostPath": "/etc/kdactl", "keyFile": "node.pem", "trustedKeysConfigMap": "kdactl-trusted-keys"}}


@pytest.fixture(scope="module")
def helm():
    return require_module("helm_python", HOW)


@pytest.fixture(scope="module")
def render_chart(helm):
    import scripts.render_chart as rc

    return rc


def objects(rendered: dict[str, str]) -> dict[str, dict]:
    docs = [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
    return {d["kind"]: d for d in docs}


def test_helm_lint_finds_nothing_above_info(helm):
    report = helm.lint(str(CHART), strict=True, namespace="kdactl")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values", [None, {"certifyArgs": ["--expect-gpus", "8"], "certKeySecret": "", "runtimeClassName": "",
                                           "nodeSelector": {}, "extraTolerations": [], "image": {"repository": "r/k", "tag": "1.2"}},
                                    SIGNING, {"signing": {"keyHostPath": "/etc/kdactl"}}])  # fmt: skip
def test_every_rendered_object_validates_against_kubernetes(render_chart, values):
    kv = require_module("kubernetes_validate", HOW)
    objs = objects(render_chart.render(values))
    assert set(objs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"}
    for version in KUBE_VERSIONS:
        for obj in objs.values():
            kv.validate(obj, version, strict=True)  # raises, naming the field, when it does not


def test_the_daemonset_runs_the_node_loop_and_may_taint_its_node(render_chart):
    objs = objects(render_chart.render({"certifyArgs": ["--expect-gpus", "8"], "renewAfterHours": 100}))
    ds, role, binding, sa = objs["DaemonSet"], objs["ClusterRole"], objs["ClusterRoleBinding"], objs["ServiceAccount"]
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert {"key": "kdactl.io/uncertified", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert c["command"] == ["kdactl-node-loop"]
    assert env["KDACTL_RENEW_AFTER_S"] == "360000" and env["KDACTL_CERTIFY_ARGS"] == "--lifetime 7 --expect-gpus 8"
    assert env["NODE_NAME"] == env["KDACTL_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {env["KDACTL_DATA_DIR"], env["KDACTL_CACHE_DIR"], env["FEATURES_DIR"], env["KDACTL_PROM_DIR"]} <= mounts
    assert {v["name"] for v in spec["volumes"]} == {m["name"] for m in c["volumeMounts"]}
    assert any("nodes" in r["resources"] and {"get", "patch"} <= set(r["verbs"]) for r in role["rules"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "kdactl"}
    assert spec["serviceAccountName"] == sa["metadata"]["name"]


def test_signing_mounts_the_nodes_own_key_read_only_and_points_kdactl_at_both_files(render_chart):
    spec = objects(render_chart.render(SIGNING))["DaemonSet"]["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    key, trusted = env["KDACTL_SIGNING_KEY"], env["KDACTL_TRUSTED_KEYS"]
    assert key == mounts["node-key"]["mountPath"] + "/node.pem" and mounts["node-key"]["readOnly"] is True
    assert volumes["node-key"]["hostPath"] == {"path": "/etc/kdactl", "type": "Directory"}  # on the node itself, never created empty
    assert trusted == mounts["trusted-keys"]["mountPath"] + "/trusted-keys" and mounts["trusted-keys"]["readOnly"] is True
    assert volumes["trusted-keys"]["configMap"] == {"name": "kdactl-trusted-keys", "items": [{"key": "trusted-keys", "path": "trusted-keys"}]}
    assert not [m for m in c["volumeMounts"] if m["name"] not in ("node-key", "trusted-keys") and m.get("readOnly")]


def test_without_signing_values_nothing_is_signed_or_checked(render_chart):
    c = objects(render_chart.render())["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in c["env"]} | {m["name"] for m in c["volumeMounts"]}
    assert not names & {"KDACTL_SIGNING_KEY", "KDACTL_TRUSTED_KEYS", "node-key", "trusted-keys"}


def test_trusted_keys_without_a_node_key_are_refused(helm, render_chart):
    """Each node's gate would then require a signature the node cannot make: every node tainted."""
    with pytest.raises(helm.HelmError, match=r"signing.trustedKeysConfigMap needs signing.keyHostPath"):
        render_chart.render({"signing": {"trustedKeysConfigMap": "kdactl-trusted-keys"}})


def test_renewal_must_come_before_expiry(helm, render_chart):
    with pytest.raises(helm.HelmError, match=r"renewAfterHours \(168\) must be shorter than certificateLifetimeDays \(7 days = 168 h\)"):
        render_chart.render({"renewAfterHours": 168})


@pytest.mark.parametrize("values,where", [
    ({"renewAfterHours": "5d"}, "/renewAfterHours"), ({"checkEverySeconds": 1}, "/checkEverySeconds"),
    ({"hostPaths": {"data": "relative"}}, "/hostPaths/data"), ({"surprise": 1}, ""), ({"taint": "bad taint"}, "/taint"),
    ({"signing": {"keyHostPath": "etc/kdactl"}}, "/signing/keyHostPath"), ({"signing": {"keyFile": "a/node.pem"}}, "/signing/keyFile"),
    ({"signing": {"secret": "x"}}, "/signing"),
])  # fmt: skip
def test_values_schema_refuses_bad_values(helm, render_chart, values, where):
    with pytest.raises(helm.HelmValuesError, match=f"(?s)schema.*at '{where}'"):
        render_chart.render(values)


def test_plain_manifest_is_the_charts_render(render_chart):
    committed = (cf.ROOT / "fleet" / "k8s" / "kdactl-daemonset.yaml").read_text()
    assert committed == render_chart.plain_manifest(), "run: python3 scripts/render_chart.py > fleet/k8s/kdactl-daemonset.yaml"
    kinds = [d["kind"] for d in yaml.safe_load_all(committed) if d]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]


def test_the_image_recipe_holds_what_the_daemonset_runs(render_chart):
    """Not a build (no container engine here): the recipe installs kubectl checked against its sha256,
    kdactl, and the two scripts under the names the DaemonSet and the loop call."""
    text = (cf.ROOT / "fleet" / "k8s" / "Containerfile").read_text()
    assert 'sha256sum --check' in text and "kubectl.sha256" in text
    assert '/opt/kdactl/src[signing]"' in text  # the chart's signing values need cryptography in the image
    for src, dest in (("fleet/provision/certify-node.sh", "kdactl-certify-node"), ("fleet/k8s/kdactl-node-loop.sh", "kdactl-node-loop")):
        assert (cf.ROOT / src).is_file() and f"/opt/kdactl/src/{src} /usr/local/bin/{dest}" in text
    ds = objects(render_chart.render())["DaemonSet"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["command"] == ["kdactl-node-loop"]
    assert 'CMD ["kdactl-node-loop"]' in text and "devel" in text  # nvcc and compute-sanitizer come with a devel image
