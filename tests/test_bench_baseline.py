import os

import pytest

from kdactl.bench import baseline as bl
from kdactl.bench.model import FAILED, OK, Outcome, ShapeRun
from kdactl.bench.stats import summarize
from kdactl.bench.suites import fixed, varlen
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_NOT_CERTIFIED, EXIT_PASS, UsageError

A, V = fixed(1, 4096, 8), varlen((17, 300), 4)


def run_with(shape, blocks, status=OK, error=None):
    o = Outcome("auto", "auto", status, note="auto -> direct")
    if status == OK and blocks:
        o.summary = summarize(blocks)
    return ShapeRun(shape, [o], error)


def test_round_trip(tmp_path):
    b = bl.Baseline("H200", 0.1, {A.label: bl.Entry(1.25, 1.2, 1.4, "direct"), V.label: bl.Entry(0.5)},
                    {"gpu": 'NVIDIA "H200"', "timer": "cupti"})  # fmt: skip
    path = tmp_path / "baselines" / "H200.toml"
    bl.save(path, b)
    assert bl.load(path) == b
    assert [p.name for p in path.parent.iterdir()] == ["H200.toml"]  # no temp file left behind


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "H200.toml"
    path.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        bl.save(path, bl.Baseline("H200", 0.1, {A.label: bl.Entry(1.0)}))
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["H200.toml"]


@pytest.mark.parametrize("text,match", [
    ("schema = 'x'\ntolerance = 0.1\n", "schema"),
    (f"schema = '{bl.SCHEMA}'\ntolerance = -1\n", "tolerance"),
    (f"schema = '{bl.SCHEMA}'\ntolerance = 0.1\n[shapes.a]\nmedian_ms = 0\n", "median_ms"),
    ("not toml [", "TOML"),
])  # fmt: skip
def test_load_rejects_malformed(tmp_path, text, match):
    p = tmp_path / "b.toml"
    p.write_text(text)
    with pytest.raises(UsageError, match=match):
        bl.load(p)


def test_record_merges_and_skips_unmeasured():
    old = bl.Baseline("H200", 0.2, {"kept": bl.Entry(9.0), A.label: bl.Entry(5.0)})
    runs = [run_with(A, [[1.0, 1.1], [1.2]]), run_with(V, None, status=FAILED)]
    new = bl.record(old, runs, "H200", {"gpu": "x"}, None)
    assert new.tolerance == 0.2  # kept from the old file
    assert new.shapes["kept"].median_ms == 9.0
    assert new.shapes[A.label].median_ms == pytest.approx(1.125) and new.shapes[A.label].route == "direct"
    assert V.label not in new.shapes
    assert "recorded_at" in new.meta
    assert bl.record(None, runs, "H200", {}, None).tolerance == bl.DEFAULT_TOLERANCE


def base(ms=1.0, tol=0.1):
    return bl.Baseline("H200", tol, {A.label: bl.Entry(ms)})


def test_gate_pass_and_faster():
    assert bl.judge(run_with(A, [[1.05], [1.08]]), base()).status == bl.PASS
    assert bl.judge(run_with(A, [[0.5], [0.5]]), base()).status == bl.PASS


def test_gate_clear_regression_fails():
    row = bl.judge(run_with(A, [[2.0], [2.1]]), base(ms=0.5))  # a baseline made 2x+ faster by hand
    assert row.status == bl.REGRESSED
    assert row.threshold_ms == pytest.approx(0.55) and "fastest block" in row.message
    assert bl.gate_exit([row]) == EXIT_NOT_CERTIFIED


def test_gate_slowdown_within_spread_is_not_a_failure():
    # median 1.2 > 1.1 threshold, but one block ran at 1.0: the run disagrees with itself that much
    row = bl.judge(run_with(A, [[1.0], [1.2], [1.3]]), base())
    assert row.status == bl.NOISE
    assert bl.gate_exit([row]) == EXIT_PASS


def test_gate_warns_when_auto_runs_another_route_than_the_baseline_timed():
    stale = bl.Baseline("H200", 0.1, {A.label: bl.Entry(1.0, route="chunk")})
    row = bl.judge(run_with(A, [[0.5], [0.5]]), stale)  # auto -> direct now
    assert row.status == bl.ROUTE_CHANGED and "timed route chunk, auto now runs direct" in row.message
    assert bl.gate_exit([row]) == EXIT_PASS
    slower = bl.judge(run_with(A, [[2.0], [2.1]]), stale)
    assert slower.status == bl.REGRESSED  # a clear regression fails whatever the route
    same = bl.Baseline("H200", 0.1, {A.label: bl.Entry(1.0, route="direct")})
    assert bl.judge(run_with(A, [[0.5], [0.5]]), same).status == bl.PASS


def test_gate_cannot_measure_is_inconclusive():
    rows = [bl.judge(run_with(A, None, status=FAILED), base()), bl.judge(ShapeRun(A, [], "setup failed: boom"), base())]
    assert {r.status for r in rows} == {bl.NOT_MEASURED}
    assert bl.gate_exit(rows) == EXIT_INCONCLUSIVE
    missing = bl.judge(run_with(V, [[1.0]]), base())
    assert missing.status == bl.NO_BASELINE and bl.gate_exit([missing]) == EXIT_INCONCLUSIVE
    assert bl.gate_exit([]) == EXIT_INCONCLUSIVE


def test_regression_outranks_inconclusive():
    rows = [bl.judge(run_with(A, [[3.0]]), base()), bl.judge(run_with(V, [[1.0]]), base())]
    assert bl.gate_exit(rows) == EXIT_NOT_CERTIFIED
