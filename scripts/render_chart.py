"""Render fleet/helm/kdactl with its default values into the plain manifest that operators without
Helm apply (fleet/k8s/kdactl-daemonset.yaml), through Helm's own engine (the helm-python-sdk wheel,
Helm's Go SDK as a library; `pip install -e '.[test]'`):

    python3 scripts/render_chart.py > fleet/k8s/kdactl-daemonset.yaml

tests/test_helm_chart.py checks that the committed file is this output."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "fleet" / "helm" / "kdactl"
ORDER = ("serviceaccount.yaml", "rbac.yaml", "daemonset.yaml")  # what kubectl apply must create first comes first
HEADER = """\
# kdactl on Kubernetes without Helm: `kubectl apply -f kdactl-daemonset.yaml`.
# Generated from the chart fleet/helm/kdactl (default values, release and namespace "kdactl") by
# scripts/render_chart.py: edit the chart, then render again. README.md beside this file says more.
apiVersion: v1
kind: Namespace
metadata:
  name: kdactl
"""


def render(values: dict | None = None, name: str = "kdactl", namespace: str = "kdactl") -> dict[str, str]:
    """Template file name -> rendered text, as `helm template` renders it."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name=name, namespace=namespace, is_install=True)
    return {Path(path).name: text for path, text in out.items() if text.strip()}


def plain_manifest() -> str:
    rendered = render()
    if set(rendered) != set(ORDER):
        raise SystemExit(f"the chart renders {sorted(rendered)}; scripts/render_chart.py orders {list(ORDER)}")
    return HEADER + "".join(f"---\n{rendered[name].strip()}\n" for name in ORDER)


if __name__ == "__main__":
    sys.stdout.write(plain_manifest())
