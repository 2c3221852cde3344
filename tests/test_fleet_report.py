"""kdactl fleet report: computed in SQL over each node's latest certificate (SQLite and a real
PostgreSQL): summary per SKU, problems by kind, perf per SKU and shape with drift, paged problem
nodes most severe first; bounded, escaped cells; no stored row can make it fail."""

import json
import math
import zlib

import pytest
from typer.testing import CliRunner

from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.fleet import render
from kdactl.fleet.ingest import ingest_command
from kdactl.fleet.report import build_report, geomean_ratio, log_ratio, report_command, worse_by
from kdactl.fleet.store import Store
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

SLOW = {"B1-T4096-H8": 1.05, "B8-T2048-H32": 1.6}  # within the baselines (1.0, 2.0), but b's own history is 0.8 / 1.6
FAST = {"B1-T4096-H8": 0.8, "B8-T2048-H32": 1.6}
FORMATS = ("table", "markdown", "json", "html")


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    with ff.store_target(request.param, tmp_path) as t:
        yield t


@pytest.fixture
def fleet(tmp_path, target):
    """Four nodes: a certified and steady, b certified but drifted, c fault-injected (wrong result),
    vm the two recorded CPU certificates (inconclusive)."""
    paths = [ff.make_cert(tmp_path, "gpu-a", when=ff.after(-d)) for d in (3, 2, 1)]
    paths += [ff.make_cert(tmp_path, "gpu-b", when=ff.after(-d), times=FAST) for d in (3, 2)]
    paths += [ff.make_cert(tmp_path, "gpu-b", when=ff.after(-1), times=SLOW)]
    paths += [ff.make_cert(tmp_path, "gpu-c", when=ff.after(-1), fault="wrong-result:direct")]
    r = ingest_command(cf.settings(tmp_path), [*paths, ff.DATA / "cpu-inconclusive.json", ff.DATA / "cpu-fault-sanitizer.json"],
                       db=target, now=lambda: ff.NOW)  # fmt: skip
    assert r.exit_code == 0, r.rejected
    return target


def _report(db, **kw):
    with Store(db) as st:
        return build_report(st, kw.pop("now", ff.NOW), **kw)


def _cli(db, *args):
    return CliRunner().invoke(app, ["fleet", "report", "--db", str(db), *args])


def test_summary_per_sku_with_totals(fleet):
    rep = _report(fleet)
    rows = {r["sku"]: r for r in rep.summary}
    h200 = rows["H200"]
    assert (h200["cc"], h200["sm_count"], h200["cuda"], h200["target"]) == ("9.0", "132", "13.0", "sm_90a")
    assert (h200["nodes"], h200["certified"], h200["not_certified"], h200["inconclusive"], h200["expired"]) == (3, 2, 1, 0, 0)
    assert h200["suite_total"] > h200["suite_passed"] > 0  # c's route smoke failed
    assert h200["sanitizer_errors"] == 0 and h200["sanitizer_runs"] == 6
    cpu = rows["(no GPU)"]
    assert cpu["certified"] == 0 and cpu["inconclusive"] == 1 and cpu["sanitizer_errors"] is None  # not run is not "0 errors"
    assert rep.summary[-1]["sku"] == "all" and rep.summary[-1]["nodes"] == 4 and rep.summary[-1]["certified"] == 2
    assert rep.nodes == 4 and rep.certificates == 9


def test_perf_table_uses_latest_certificates_and_geomean(fleet):
    rows = {(r["sku"], r["shape"]): r for r in _report(fleet).perf}
    small = rows[("H200", "B1-T4096-H8")]
    assert small["gpus"] == 6 and small["baseline"] == 1.0 and small["measured"] == 1.0  # median of a 1.0, b 1.05, c 1.0
    big = rows[("H200", "B8-T2048-H32")]
    assert big["measured"] == 2.0 and big["ratio"] == 1.0
    assert rows[("H200", "geomean")]["ratio"] == pytest.approx(1.0)


def test_problem_nodes_most_severe_first_with_kinds(fleet):
    rep = _report(fleet)
    assert [p["node"] for p in rep.problems] == ["gpu-c", "vm", "gpu-b"]  # not certified, inconclusive, drifted
    probs = {p["node"]: p for p in rep.problems}
    assert any(x.startswith("drifted: GPU ") and "B1-T4096-H8" in x and "+31.2% worse" in x for x in probs["gpu-b"]["problems"])
    assert probs["gpu-c"]["verdict"] == "not_certified" and any("wrong-result" in x for x in probs["gpu-c"]["problems"])
    assert probs["vm"]["severity"] == "inconclusive" and any("fault injected" in x for x in probs["vm"]["problems"])
    kinds = {k["kind"]: k["nodes"] for k in rep.kinds}
    assert kinds == {"fail: suite.test_routes::test_route_smoke[direct]": 1, "error: detect": 1, "drifted": 1, "fault injected": 2}
    assert rep.kinds[0]["kind"] == "fail: suite.test_routes::test_route_smoke[direct]" and rep.problem_nodes == 3


def test_severity_not_alphabet_orders_the_problem_nodes(tmp_path, target):
    """An inconclusive node named first in the alphabet still comes after a failed one."""
    paths = [ff.make_cert(tmp_path, "aaa", fault="crash"), ff.make_cert(tmp_path, "mmm", lifetime=1),
             ff.make_cert(tmp_path, "zzz", fault="wrong-result:direct")]  # fmt: skip
    ingest_command(cf.settings(tmp_path), paths, db=target, now=lambda: ff.NOW)
    doc = _report(target, now=ff.after(2)).to_json()
    assert [(p["node"], p["severity"]) for p in doc["problems"]["rows"]] == [("zzz", "not certified"), ("aaa", "inconclusive"), ("mmm", "expired")]
    assert doc["summary"][0]["expired"] == 1 and doc["problem_kinds"][0]["kind"] == "fail: suite.test_routes::test_route_smoke[direct]"


def test_paging_and_since_in_sql(fleet):
    page = _report(fleet, limit=1, offset=1)
    assert [p["node"] for p in page.problems] == ["vm"] and page.problem_nodes == 3
    assert "2-2 of 3" in render.markdown(page) and "--offset 2 for the next" in render.markdown(page)
    past = _report(fleet, limit=1, offset=10)
    assert past.problems == [] and past.problem_nodes == 3
    rep = _report(fleet, since=ff.after(-1.5))
    assert rep.certificates == 3 and rep.nodes == 3  # the latest of a, b, c; vm's were issued before
    assert "gpu-b" not in {p["node"] for p in rep.problems}  # no history left to drift from


def test_expired_nodes_are_not_certified(fleet):
    rep = _report(fleet, now=ff.after(30))
    h200 = next(r for r in rep.summary if r["sku"] == "H200")
    assert h200["certified"] == 0 and h200["expired"] == 2
    assert all(any(x.startswith("expired:") for x in p["problems"]) for p in rep.problems)
    assert {p["node"] for p in rep.problems} == {"gpu-a", "gpu-b", "gpu-c", "vm"}
    soon = _report(fleet, now=ff.after(5.5))
    assert next(r for r in soon.summary if r["sku"] == "H200")["expiring_1d"] == 2


def test_drift_direction_and_history_needed(tmp_path, target):
    def series(host, values, unit="ms"):
        base = ff.make_cert(tmp_path, host, gpus=1)
        out = []
        for day, v in enumerate(values):
            def change(d, v=v, day=day):
                d["issued_at"] = f"2026-12-0{day + 1}T00:00:00Z"
                for r in d["results"]:
                    if r["check"].startswith("perf["):
                        r.update(measured=v, unit=unit)
            out.append(ff.resealed(base, tmp_path / "series" / f"{host}-{day}.json", change))
        return out

    files = (series("one-earlier", [1.0, 1.2]) + series("slower", [1.0, 1.0, 1.2]) + series("within", [1.0, 1.0, 1.05])
             + series("less-throughput", [100, 100, 80], "TFLOPS") + series("more-throughput", [100, 100, 120], "TFLOPS"))  # fmt: skip
    assert ingest_command(cf.settings(tmp_path), files, db=target, now=lambda: ff.NOW).exit_code == 0
    drifted = {p["node"] for p in _report(target).problems if p["severity"] == "drifted"}
    assert drifted == {"slower", "less-throughput"}


def test_pure_ratio_helpers_take_extremes():
    assert log_ratio(1e-320, 1e300) == pytest.approx(math.log(1e-320) - math.log(1e300))
    assert log_ratio(1.0, None) is None and log_ratio(1.0, 0.0) is None
    assert geomean_ratio([math.log(2.0), math.log(8.0)]) == pytest.approx(4.0)
    assert geomean_ratio([5000.0]) == math.exp(700.0)  # no OverflowError
    assert worse_by(1.2, 1.0, "ms") == pytest.approx(0.2) and worse_by(80, 100, "TFLOPS") == pytest.approx(0.2)
    assert worse_by(1e300, 1e-320, "ms") > 1e300


# --- a test per defect of the old report ------------------------------------------------------


def _store_raw(db, tmp_path, host, change):
    """Store a certificate as Store.add receives it, bypassing ingest's checks: what an older kdactl,
    or a schema that allowed it, may have left in the store."""
    doc = json.loads(ff.resealed(ff.make_cert(tmp_path, host), tmp_path / "raw" / f"{host}.json", change).read_text())
    with Store(db) as st:
        assert st.add(doc, f"{host}.json", ff.NOW)


def _set_perf(d, measured, baseline):
    for r in d["results"]:
        if r["check"].startswith("perf["):
            r.update(measured=measured, baseline=baseline)


@pytest.mark.parametrize("host, change", [
    ("tiny-perf", lambda d: _set_perf(d, 1e-320, 1e300)),  # measured/baseline underflows to 0: "math domain error"
    ("list-uuid", lambda d: d["gpus"][0].update(uuid=["GPU-a", "GPU-b"])),  # "unhashable type: 'list'"
])  # fmt: skip
def test_report_never_dies_on_a_stored_row(tmp_path, target, host, change):
    ingest_command(cf.settings(tmp_path), [ff.make_cert(tmp_path, "gpu-a")], db=target, now=lambda: ff.NOW)
    _store_raw(target, tmp_path, host, change)
    for fmt in FORMATS:
        r = _cli(target, "--format", fmt)
        assert r.exit_code == 0 and "internal error" not in r.output, r.output
    doc = json.loads(_cli(target, "--json").stdout)
    assert doc["certificates"] == 2
    if host == "tiny-perf":  # not a perf value in any unit: named, kept out of the medians
        assert any(k["kind"].startswith("perf value out of range: perf[") for k in doc["problem_kinds"])
        assert all(r["measured"] in (1.0, 2.0, None) for r in doc["perf"])


def test_markdown_and_html_escape_what_nodes_wrote(tmp_path, target):
    evil = '<img src=x onerror=alert(1)>*[x](http://e)|'
    ingest_command(cf.settings(tmp_path), [ff.make_cert(tmp_path, evil, fault="crash", name="evil.json")], db=target, now=lambda: ff.NOW)
    md = _cli(target, "--format", "markdown").stdout
    assert "<img" not in md and "&lt;img src=x onerror=alert\\(1\\)&gt;" not in md
    assert "&lt;img src=x onerror=alert(1)&gt;\\*\\[x\\](http://e)\\|" in md
    page = _cli(target, "--format", "html").stdout
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    from rich.console import Console

    console = Console(record=True, width=1000)
    with Store(target) as st:
        build_report(st, ff.NOW).render(console)
    assert evil in console.export_text()  # rich printed it as text, not as markup


def test_every_cell_is_bounded(tmp_path, target):
    """A 6 KB failure message and a 2 KB hostname with terminal escapes."""
    host = "\x1b[31m" + "h" * 2000

    def change(d):
        d["results"].append({"check": "route_smoke[direct]", "status": "fail", "message": "m" * 6000, "gpu": 0,
                             "duration_s": 0.0, "required": True})
        d["node"]["hostname"] = host
        d["verdict"], d["reason"] = "not_certified", "r" * 6000

    _store_raw(target, tmp_path, "long", change)
    doc = json.loads(_cli(target, "--json").stdout)
    row = doc["problems"]["rows"][0]
    assert len(row["node"]) <= 120 and "\x1b" not in row["node"] and "\\u001b" in row["node"]
    assert all(len(line) <= 240 for line in row["problems"])
    page = _cli(target, "--format", "html").stdout
    assert max(len(cell) for cell in page.split("<td>")) < 1600 and "\x1b" not in page
    assert max(len(line) for line in _cli(target, "--format", "markdown").stdout.splitlines()) < 2500


def test_report_reads_no_stored_document(fleet, monkeypatch):
    """Computed from the extracted columns: no document is decompressed or parsed, with --since or without."""
    decoded = []
    real_loads, real_decompress = json.loads, zlib.decompress
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: (decoded.append(len(s)), real_loads(s, *a, **k))[1])
    monkeypatch.setattr(zlib, "decompress", lambda b, *a: (decoded.append(len(b)), real_decompress(b, *a))[1])
    for args in ((), ("--since", "2030-01-01"), ("--format", "html")):
        assert _cli(fleet, *args).exit_code == 0
    assert [n for n in decoded if n > 2000] == []


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_report_formats_and_errors(fleet, monkeypatch, tmp_path):
    monkeypatch.setenv("KDACTL_DATA_DIR", str(tmp_path / "data"))
    res = _cli(fleet, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["command"] == "fleet report"
    for fmt, marker in (("markdown", "## Fleet summary"), ("html", "<table>"), ("table", "Fleet summary per SKU")):
        res = _cli(fleet, "--format", fmt)
        assert res.exit_code == 0 and marker in res.stdout, res.output
    assert json.loads(_cli(fleet, "--format", "json").stdout)["nodes"] == 4
    assert _cli(fleet, "--format", "pdf").exit_code == 2
    assert _cli(fleet, "--since", "last week").exit_code == 2
    assert _cli(fleet, "--limit", "0").exit_code == 2 and _cli(fleet, "--offset", "-1").exit_code == 2
    assert _cli(tmp_path / "none.db").exit_code == 2
    assert "--since" in CliRunner().invoke(app, ["fleet", "report", "--help"]).stdout


def test_report_command_since_date(fleet, tmp_path):
    rep = report_command(cf.settings(tmp_path), fleet, "json", "2026-12-04", now=lambda: ff.NOW)
    assert rep.since == "2026-12-04T00:00:00Z" and rep.certificates == 3
    with pytest.raises(UsageError, match="--tolerance"):
        report_command(cf.settings(tmp_path), fleet, tolerance=2.0)
