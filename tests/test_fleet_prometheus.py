"""fleet/prometheus: the documented metrics are exactly the ones kdactl writes; the alert rules parse
and use only those metrics."""

import re
from pathlib import Path

import yaml

from kdactl.certify.outputs import prom_text
from tests import fleet_fakes as ff

import json

DIR = Path(__file__).resolve().parents[1] / "fleet" / "prometheus"


def _written(tmp_path) -> set[str]:
    doc = json.loads(ff.make_cert(tmp_path, "gpu-a").read_text())
    return set(re.findall(r"^# TYPE (\S+) gauge$", prom_text(doc), re.M))


def test_documented_metrics_match_what_certify_writes(tmp_path):
    documented = set(re.findall(r"^\| `(kdactl_[a-z_]+)` \|", (DIR / "README.md").read_text(), re.M))
    assert documented == _written(tmp_path)


def test_alert_rules_parse_and_use_written_metrics(tmp_path):
    rules = yaml.safe_load((DIR / "alerts.yaml").read_text())["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {"KdactlNodeNotCertified", "KdactlCertificateExpired", "KdactlCertificateExpiringSoon"} <= names
    written = _written(tmp_path)
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"} and r["annotations"]["summary"]
        used = set(re.findall(r"\bkdactl_[a-z_]+", r["expr"]))
        assert used and used <= written, (r["alert"], used - written)
