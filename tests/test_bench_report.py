import importlib.util
import json

import pytest
from rich.console import Console

from kdactl.bench.progress import NullProgress
from kdactl.bench.report import cell, geomeans
from kdactl.bench.runner import BenchOptions, run_bench
from kdactl.settings import Settings
from tests.bench_fakes import FakeHarness

SETTINGS = Settings.from_env({"HOME": "/nonexistent"})


def report(h=None, **kw):
    h = h or FakeHarness(times={"auto": 1.0, "direct": 1.0, "fla.chunk_kda": 2.0, "fla.fused_recurrent_kda": 8.0},
                         rejected={"small_bh": "needs H <= 8"}, wrong={"fla.fused_recurrent_kda"})  # fmt: skip
    kw.setdefault("shapes", ("1,64,2", "2,128,4"))
    kw.setdefault("routes", "auto,direct,small_bh")
    return run_bench(SETTINGS, BenchOptions(iters=4, warmup=1, **kw), harness_factory=lambda o: h, progress=NullProgress())


def text_of(r) -> str:
    console = Console(record=True, width=200)
    r.render(console)
    return console.export_text()


def test_table_shows_medians_ratios_marks_and_geomean():
    r = report()
    out = text_of(r)
    assert "B1-T64-H2-D128" in out and "geomean" in out
    assert "2.000 (2.00x)" in out  # fla.chunk_kda against auto
    assert "—" in out and "needs H <= 8" in out  # rejected route, with its reason
    assert "FAILED" in out and "wrong result" in out  # never hidden
    assert "cold L2" in out and "timer fake" in out and "ABBA" in out
    assert "bench: pass" in out


def test_geomean_rows():
    g = geomeans(report().runs)
    assert g["auto"]["ms"] == pytest.approx(1.0)
    assert g["fla.chunk_kda"]["ratio_vs_auto"] == pytest.approx(2.0) and g["fla.chunk_kda"]["shapes"] == 2
    assert g["fla.fused_recurrent_kda"]["ms"] is None


def test_cell_marks():
    run = report().runs[0]
    assert cell(run, "auto") == "1.000"
    assert cell(run, "small_bh") == "—"
    assert cell(run, "fla.fused_recurrent_kda") == "FAILED"


def test_json_is_one_serializable_document():
    doc = json.loads(json.dumps(report().to_json()))
    assert doc["schema"] == "kdactl.bench/v1" and doc["exit_code"] == 0
    cands = {c["name"]: c for c in doc["shapes"][0]["candidates"]}
    assert cands["small_bh"]["status"] == "rejected" and cands["small_bh"]["reason"] == "needs H <= 8"
    assert cands["auto"]["timing"]["median_ms"] == 1.0 and cands["auto"]["check"]["ok"]
    assert cands["auto"]["note"] == "auto -> direct"
    assert doc["info"]["timer"] == "fake" and doc["method"]["statistic"] == "median of block medians"


def test_markdown_file_and_stdout(tmp_path):
    md = tmp_path / "bench.md"
    r = report(markdown=str(md))
    text = md.read_text()
    assert text.startswith("| shape | auto ms |") and "| geomean |" in text and "Method:" in text
    r = report(markdown="-")
    assert text_of(r).lstrip().startswith("| shape |")


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_plot_png(tmp_path):
    png = tmp_path / "bench.png"
    report(plot=png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
