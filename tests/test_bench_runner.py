import pytest

from kdactl.bench import baseline as bl
from kdactl.bench.model import ERROR, FAILED, OK, REJECTED, UNAVAILABLE
from kdactl.bench.progress import NullProgress
from kdactl.bench.runner import BenchOptions, check_options, run_bench
from kdactl.errors import Inconclusive, UsageError
from kdactl.settings import Settings
from tests.bench_fakes import FakeHarness

SETTINGS = Settings.from_env({"HOME": "/nonexistent"})
ONE = ("1,64,2",)


def bench(h: FakeHarness, **kw):
    kw.setdefault("shapes", ONE)
    kw.setdefault("iters", 4)
    kw.setdefault("warmup", 2)
    return run_bench(SETTINGS, BenchOptions(**kw), harness_factory=lambda o: h, progress=NullProgress())


def test_abba_interleaving_and_flush_before_every_timed_call():
    h = FakeHarness()
    r = bench(h, iters=4)  # 2 rounds of blocks of 1
    assert h.timed_order() == ["auto", "direct", "fla.chunk_kda", "fla.chunk_kda", "direct", "auto"] * 2
    timed = [i for i, e in enumerate(h.events) if e.startswith("call:")][-12:]
    assert all(h.events[i - 1] == "flush" for i in timed)  # the flush precedes each timed call
    assert r.exit_code == 0 and h.released == 1


def test_warmup_runs_before_timing():
    h = FakeHarness()
    bench(h, warmup=3)
    first_flush = h.events.index("flush")
    warm = [e for e in h.events[:first_flush] if e.startswith("call:")]
    # one call per check, then three warmup calls each
    assert warm.count("call:auto") == 4 and warm.count("call:fla.chunk_kda") == 4


def test_median_of_block_medians_reaches_the_report():
    h = FakeHarness(times={"auto": 1.0, "direct": 1.0}, jitter=lambda n, i: 5.0 if (n, i) == ("auto", 0) else 0.0)
    r = bench(h, iters=8, peers="none")
    auto = r.runs[0].outcome("auto")
    assert auto.summary.median_ms == 1.0 and auto.summary.max_ms == 6.0 and auto.summary.samples == 8


def test_what_a_checked_call_says_joins_its_note():
    h = FakeHarness(details={"auto": "3 of 4 segment starts warm (decay bound), 1 stitched", "direct": "ran"})
    r = bench(h, peers="none")
    assert r.runs[0].outcome("auto").note == "auto -> direct; 3 of 4 segment starts warm (decay bound), 1 stitched"
    assert r.runs[0].outcome("direct").note == "ran"  # a candidate without a note of its own


def test_wrong_own_kernel_is_failed_not_timed_and_exits_1():
    h = FakeHarness(wrong={"direct"})
    r = bench(h)
    o = r.runs[0].outcome("direct")
    assert o.status == FAILED and o.summary is None and "wrong result" in o.reason
    assert "direct" not in h.timed_order()
    assert r.exit_code == 1 and any("direct" in x for x in r.reasons)


def test_wrong_peer_is_reported_but_not_evidence_against_the_node():
    h = FakeHarness(wrong={"fla.chunk_kda"})
    r = bench(h)
    assert r.runs[0].outcome("fla.chunk_kda").status == FAILED
    assert "fla.chunk_kda" not in h.timed_order()
    assert r.exit_code == 0
    assert any("fla.chunk_kda [failed]" in p for p in r.problems())


@pytest.mark.parametrize("where", ["check", "warmup", "time"])
def test_crash_of_own_kernel_is_inconclusive(where):
    h = FakeHarness(raising={"direct": where})
    r = bench(h)
    o = r.runs[0].outcome("direct")
    assert o.status == ERROR and o.summary is None
    assert {"check": "check raised", "warmup": "warmup raised", "time": "timing raised"}[where] in o.reason
    assert r.exit_code == 3
    assert r.runs[0].outcome("auto").status == OK  # the others still ran


def test_rejected_and_unavailable_are_shown_with_reasons():
    h = FakeHarness(rejected={"chunk": "T < 64"}, unavailable={"fla.chunk_kda"})
    r = bench(h, routes="auto,direct,chunk")
    run = r.runs[0]
    assert run.outcome("chunk").status == REJECTED and run.outcome("chunk").reason == "T < 64"
    assert run.outcome("fla.chunk_kda").status == UNAVAILABLE
    assert r.exit_code == 0


def test_shape_setup_error_is_inconclusive():
    r = bench(FakeHarness(setup_error="out of memory"))
    assert r.runs[0].error and "out of memory" in r.runs[0].error
    assert r.exit_code == 3


def test_gate_against_a_baseline_made_2x_faster_fails(tmp_path):
    path = tmp_path / "H200.toml"
    r = bench(FakeHarness(), record_baseline=True, baseline=path)
    assert r.exit_code == 0 and path.is_file()
    recorded = bl.load(path)
    label = r.runs[0].shape.label
    assert recorded.shapes[label].median_ms == 1.0 and recorded.sku == "H200"
    assert bench(FakeHarness(), gate=True, baseline=path).exit_code == 0
    faster = bl.Baseline("H200", recorded.tolerance, {label: bl.Entry(0.5)}, recorded.meta)
    bl.save(path, faster)
    r = bench(FakeHarness(), gate=True, baseline=path)
    assert r.exit_code == 1 and r.gate_rows[0].status == bl.REGRESSED


def test_gate_without_baseline_is_inconclusive(tmp_path):
    with pytest.raises(Inconclusive, match="no baseline"):
        bench(FakeHarness(), gate=True, baseline=tmp_path / "missing.toml")
    with pytest.raises(Inconclusive, match="unknown"):
        bench(FakeHarness(sku="unknown"), gate=True)


def test_gate_on_a_shape_without_baseline_entry_is_inconclusive(tmp_path):
    path = tmp_path / "b.toml"
    bl.save(path, bl.Baseline("H200", 0.1, {"B9-T9-H9-D128": bl.Entry(1.0)}))
    assert bench(FakeHarness(), gate=True, baseline=path).exit_code == 3


def test_failed_run_does_not_overwrite_baseline(tmp_path):
    path = tmp_path / "b.toml"
    r = bench(FakeHarness(wrong={"auto"}), record_baseline=True, baseline=path)
    assert r.exit_code == 1 and not path.exists()
    assert any("NOT written" in n for n in r.notes)


def test_default_baseline_path_is_per_sku(tmp_path, monkeypatch):
    monkeypatch.setattr(bl, "default_path", lambda sku: tmp_path / f"{sku}.toml")
    bench(FakeHarness(sku="B200"), record_baseline=True)
    assert (tmp_path / "B200.toml").is_file()


@pytest.mark.parametrize("kw,match", [
    (dict(routes="auto,bogus"), "--routes"),
    (dict(peers="triton"), "--peers"),
    (dict(iters=1), "--iters"),
    (dict(warmup=0), "--warmup"),
    (dict(gate=True, routes="direct"), "auto"),
    (dict(markdown="-", as_json=True), "stdout"),
    (dict(plot="x.svg"), "png"),
    (dict(timer="tsc"), "--timer"),
    (dict(config="fused"), "--config"),
    (dict(peers="fla,flashkda,nvidia"), "--peers"),
])  # fmt: skip
def test_usage_errors_come_before_the_gpu(kw, match):
    with pytest.raises(UsageError, match=match):
        check_options(BenchOptions(shapes=ONE, **kw))


def test_json_keeps_stdout_clean(capsys):
    class Chatty(FakeHarness):
        def candidates(self, shape, routes, peers):
            print("autotuning...")  # a library printing during the run
            return super().candidates(shape, routes, peers)

    bench(Chatty(), as_json=True)
    out = capsys.readouterr()
    assert out.out == "" and "autotuning" in out.err


def test_peers_all_none_and_comma_lists():
    assert check_options(BenchOptions(shapes=ONE, peers="all")).peers == ("fla", "flashkda", "cudnn")
    assert check_options(BenchOptions(shapes=ONE, peers="none")).peers == ()
    assert check_options(BenchOptions(shapes=ONE, peers="cudnn, fla,cudnn")).peers == ("cudnn", "fla")


def test_each_peer_named_is_asked_for_and_shown():
    h = FakeHarness(times={"auto": 1.0, "fla.chunk_kda": 2.0, "flashkda.fwd": 1.5, "cudnn.kda_hopper_cuda": 0.5},
                    unavailable={"flashkda.fwd"})  # fmt: skip
    r = bench(h, routes="auto", peers="flashkda,cudnn")
    assert [o.name for o in r.runs[0].outcomes] == ["auto", "flashkda.fwd", "cudnn.kda_hopper_cuda"]
    assert r.runs[0].outcome("flashkda.fwd").status == UNAVAILABLE and r.exit_code == 0
    assert r.runs[0].median("cudnn.kda_hopper_cuda") == 0.5


def test_config_reaches_the_harness_and_keys_results_and_baselines(tmp_path):
    h = FakeHarness()
    path = tmp_path / "H200.toml"
    r = bench(h, suite="smoke", shapes=(), config="lower-bound", record_baseline=True, baseline=path)
    assert {s.config for s in h.shapes} == {"lower-bound"}
    assert r.runs[0].shape.key == "lower-bound:B1-T4096-H8-D128"
    assert set(bl.load(path).shapes) == {f"lower-bound:{s.label}" for s in h.shapes}
    # A plain run of the same shapes is judged against its own keys: no entry for it yet.
    assert bench(FakeHarness(), suite="smoke", shapes=(), gate=True, baseline=path).exit_code == 3
    assert bench(FakeHarness(), suite="smoke", shapes=(), config="lower-bound", gate=True, baseline=path).exit_code == 0


def test_unknown_fault_is_a_usage_error_before_the_gpu():
    def no_harness(o):
        raise AssertionError("the harness must not start")

    with pytest.raises(UsageError, match="KDACTL_FAULT='slowly'"):
        run_bench(Settings.from_env({"KDACTL_FAULT": "slowly"}), BenchOptions(shapes=ONE), harness_factory=no_harness,
                  progress=NullProgress())  # fmt: skip


class StopsAt(FakeHarness):
    """Interrupted while setting up its ``at``-th shape (0-based), by Ctrl-C or by a SIGTERM to itself."""

    def __init__(self, at: int, how: str = "ctrl-c", **kw):
        super().__init__(**kw)
        self.at, self.how = at, how

    def candidates(self, shape, routes, peers):
        if len(self.shapes) == self.at:
            if self.how == "sigterm":
                import os
                import signal
                import time

                os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` sends; the runner turns it into Ctrl-C
                time.sleep(5)  # the handler's KeyboardInterrupt ends this sleep at once
                raise AssertionError("SIGTERM did not interrupt the run")
            raise KeyboardInterrupt
        return super().candidates(shape, routes, peers)


THREE = ("1,64,2", "1,128,2", "1,256,2")


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_run_keeps_and_writes_the_shapes_it_finished(tmp_path, how):
    md = tmp_path / "out.md"
    h = StopsAt(2, how)
    r = bench(h, shapes=THREE, markdown=str(md))
    assert [run.shape.key for run in r.runs] == ["B1-T64-H2-D128", "B1-T128-H2-D128"]
    assert all(run.outcome("auto").summary is not None for run in r.runs)
    assert r.exit_code == 3 and r.stopped == "interrupted after 2 of 3 shapes; not measured: B1-T256-H2-D128"
    assert r.reasons == [r.stopped] and r.to_json()["stopped"] == r.stopped
    text = md.read_text()
    assert text.startswith(f"**Incomplete**: {r.stopped}.") and "B1-T128-H2-D128" in text
    assert h.released == 1


def test_an_interrupted_run_records_no_baseline_and_a_wrong_result_still_fails(tmp_path):
    path = tmp_path / "b.toml"
    r = bench(StopsAt(1), shapes=THREE, record_baseline=True, baseline=path)
    assert r.exit_code == 3 and not path.exists() and any("NOT written" in n for n in r.notes)
    r = bench(StopsAt(1, wrong={"auto"}), shapes=THREE)
    assert r.exit_code == 1 and r.reasons[-1] == r.stopped  # evidence found before the stop still counts


def test_an_interrupt_before_any_shape_finished_ends_as_an_interrupted_command():
    with pytest.raises(KeyboardInterrupt):
        bench(StopsAt(0), shapes=THREE)
