"""kdactl fleet report: qualification per SKU, perf per SKU and shape with geomeans, problem nodes."""

import json
import math

import pytest
from typer.testing import CliRunner

from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.fleet import render
from kdactl.fleet.report import build_report, drift, geomean, report_command
from kdactl.fleet.store import Store, ingest_command
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

SLOW = {"B1-T4096-H8": 1.05, "B8-T2048-H32": 1.6}  # within the baselines (1.0, 2.0), but b's own history is 0.8 / 1.6
FAST = {"B1-T4096-H8": 0.8, "B8-T2048-H32": 1.6}


@pytest.fixture
def fleet(tmp_path):
    """Four nodes: a certified and steady, b certified but drifted, c fault-injected (wrong result),
    vm the two recorded CPU certificates (inconclusive). Ingested into tmp_path/f.db."""
    paths = [ff.make_cert(tmp_path, "gpu-a", when=ff.after(-d)) for d in (3, 2, 1)]
    paths += [ff.make_cert(tmp_path, "gpu-b", when=ff.after(-d), times=FAST) for d in (3, 2)]
    paths += [ff.make_cert(tmp_path, "gpu-b", when=ff.after(-1), times=SLOW)]
    paths += [ff.make_cert(tmp_path, "gpu-c", when=ff.after(-1), fault="wrong-result:direct")]
    r = ingest_command(cf.settings(tmp_path), [*paths, ff.DATA / "cpu-inconclusive.json", ff.DATA / "cpu-fault-sanitizer.json"],
                       db=tmp_path / "f.db", now=lambda: ff.NOW)  # fmt: skip
    assert r.exit_code == 0, r.rejected
    return tmp_path / "f.db"


def _report(db, **kw):
    with Store(db) as st:
        return build_report(st.documents(kw.pop("since", None)), kw.pop("now", ff.NOW), **kw)


def test_qualification_per_sku(fleet):
    rep = _report(fleet)
    rows = {r["sku"]: r for r in rep.qualification}
    h200 = rows["H200"]
    assert (h200["cc"], h200["sm_count"], h200["cuda"], h200["target"]) == ("9.0", "132", "13.0", "sm_90a")
    assert (h200["nodes_certified"], h200["nodes_total"]) == (2, 3)
    assert h200["suite_total"] > h200["suite_passed"] > 0  # c's route smoke failed
    assert h200["sanitizer_errors"] == 0 and h200["sanitizer_runs"] == 6
    cpu = rows["(no GPU)"]
    assert cpu["nodes_certified"] == 0 and cpu["sanitizer_errors"] is None  # not run is not "0 errors"
    assert rep.nodes == 4 and rep.certificates == 9


def test_perf_table_uses_latest_certificates_and_geomean(fleet):
    rows = {(r["sku"], r["shape"]): r for r in _report(fleet).perf}
    small = rows[("H200", "B1-T4096-H8")]
    assert small["gpus"] == 6 and small["baseline"] == 1.0 and small["measured"] == 1.0  # median of a 1.0, b 1.05, c 1.0
    big = rows[("H200", "B8-T2048-H32")]
    assert big["measured"] == 2.0 and big["ratio"] == 1.0
    assert rows[("H200", "geomean")]["ratio"] == pytest.approx(math.sqrt(1.0 * 1.0))


def test_problem_nodes_failed_inconclusive_drifted(fleet):
    probs = {p["node"]: p for p in _report(fleet).problems}
    assert set(probs) == {"gpu-b", "gpu-c", "vm"}
    assert any(x.startswith("drifted: GPU ") and "B1-T4096-H8" in x and "+31.2% worse" in x for x in probs["gpu-b"]["problems"])
    assert probs["gpu-c"]["verdict"] == "not_certified" and any("wrong-result" in x for x in probs["gpu-c"]["problems"])
    assert probs["vm"]["verdict"] == "inconclusive" and any("fault injected" in x for x in probs["vm"]["problems"])


def test_expired_nodes_are_not_certified(fleet):
    rep = _report(fleet, now=ff.after(30))
    h200 = next(r for r in rep.qualification if r["sku"] == "H200")
    assert h200["nodes_certified"] == 0
    assert all(any(x.startswith("expired:") for x in p["problems"]) for p in rep.problems)
    assert {p["node"] for p in rep.problems} == {"gpu-a", "gpu-b", "gpu-c", "vm"}


def test_since_limits_the_certificates(fleet):
    rep = _report(fleet, since=ff.after(-1.5))
    assert rep.certificates == 3 and rep.nodes == 3  # the latest of a, b, c; vm's were issued before
    assert "gpu-b" not in {p["node"] for p in rep.problems if any("drifted" in x for x in p["problems"])}  # no history left


def test_drift_direction_and_history_needed():
    def doc(t, v, unit="ms"):
        return {"node": {"hostname": "n"}, "issued_at": t, "gpus": [{"index": 0, "uuid": "U", "sku": "H200"}],
                "results": [{"check": "perf[x]", "gpu": 0, "shape": "x", "measured": v, "baseline": 1.0, "unit": unit}]}
    assert drift([doc("1", 1.0), doc("2", 1.2)]) == {}  # one earlier run: not enough history
    assert "n" in drift([doc("1", 1.0), doc("2", 1.0), doc("3", 1.2)])
    assert drift([doc("1", 1.0), doc("2", 1.0), doc("3", 1.05)]) == {}  # within 10 %
    assert "n" in drift([doc("1", 100, "TFLOPS"), doc("2", 100, "TFLOPS"), doc("3", 80, "TFLOPS")])  # lower throughput is worse
    assert drift([doc("1", 100, "TFLOPS"), doc("2", 100, "TFLOPS"), doc("3", 120, "TFLOPS")]) == {}
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_markdown_html_json_renderings(fleet):
    rep = _report(fleet)
    md = render.markdown(rep)
    assert "| SKU | CC | SMs | CUDA | target | suite passed | sanitizer errors | nodes certified |" in md
    assert "| H200 | 9.0 | 132 | 13.0 | sm_90a |" in md and "| H200 | geomean |" in md
    page = render.html_page(rep)
    assert page.startswith("<!DOCTYPE html>") and "<td>gpu-c</td>" in page and "<script" not in page
    assert json.loads(json.dumps(rep.to_json()))["nodes"] == 4


def test_cli_report_formats_and_errors(fleet, monkeypatch, tmp_path):
    monkeypatch.setenv("KDACTL_DATA_DIR", str(tmp_path / "data"))
    run = CliRunner().invoke
    res = run(app, ["fleet", "report", "--db", str(fleet), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["command"] == "fleet report"
    for fmt, marker in (("markdown", "## Qualification"), ("html", "<table>"), ("table", "Qualification per SKU")):
        res = run(app, ["fleet", "report", "--db", str(fleet), "--format", fmt])
        assert res.exit_code == 0 and marker in res.stdout, res.output
    assert json.loads(run(app, ["fleet", "report", "--db", str(fleet), "--format", "json"]).stdout)["nodes"] == 4
    assert run(app, ["fleet", "report", "--db", str(fleet), "--format", "pdf"]).exit_code == 2
    assert run(app, ["fleet", "report", "--db", str(fleet), "--since", "last week"]).exit_code == 2
    assert run(app, ["fleet", "report", "--db", str(tmp_path / "none.db")]).exit_code == 2
    assert "--since" in run(app, ["fleet", "report", "--help"]).stdout


def test_report_command_since_date(fleet, tmp_path):
    rep = report_command(cf.settings(tmp_path), fleet, "json", "2026-12-04", now=lambda: ff.NOW)
    assert rep.since == "2026-12-04T00:00:00Z" and rep.certificates == 3
    with pytest.raises(UsageError, match="--tolerance"):
        report_command(cf.settings(tmp_path), fleet, tolerance=2.0)
