"""kdactl bench --host: CPU cost per call (eager and graph replay) from the pure timing logic over a
fake clock, through the runner and the report with a fake harness."""

import json

import pytest
from rich.console import Console

from kdactl.bench.host import host_cost, per_call_us
from kdactl.bench.progress import NullProgress
from kdactl.bench.runner import BenchOptions, check_options, run_bench
from kdactl.bench.suites import HOST_SHAPES
from kdactl.errors import UsageError
from kdactl.settings import Settings
from tests.bench_fakes import FakeHarness

SETTINGS = Settings.from_env({"HOME": "/nonexistent"})


def test_per_call_is_the_median_repeat_over_its_calls_and_syncs_outside_the_span():
    events, clock = [], [0.0]
    costs = iter([5e-6] * 10 + [50e-6] * 10 + [6e-6] * 10)  # one slow repeat (a hiccup) among three

    def fn():
        events.append("call")
        clock[0] += next(costs)

    def now():
        events.append("clock")
        return clock[0]

    assert per_call_us(fn, lambda: events.append("sync"), now, calls=10, repeats=3) == pytest.approx(6.0)
    first = events[: events.index("clock", 2) + 2]
    assert first == ["sync", "clock"] + ["call"] * 10 + ["clock", "sync"]


def test_uncapturable_candidate_keeps_its_eager_figure_with_the_reason():
    def capture(fn):
        raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing\nmore")

    cost = host_cost(lambda: None, lambda: None, iter(range(0, 10**6, 3)).__next__, capture, calls=4, repeats=1)
    assert cost.eager_us > 0 and cost.replay_us is None
    assert cost.replay_note == "not capturable: RuntimeError: cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"


@pytest.mark.parametrize("bad", [dict(calls=0), dict(repeats=0)])
def test_per_call_needs_calls_and_repeats(bad):
    with pytest.raises(ValueError):
        per_call_us(lambda: None, lambda: None, lambda: 0.0, **{"calls": 2, "repeats": 2, **bad})


def host_bench(h, **kw):
    kw.setdefault("warmup", 1)
    return run_bench(SETTINGS, BenchOptions(host=True, **kw), harness_factory=lambda o: h, progress=NullProgress())


def test_host_mode_defaults_to_the_small_shapes_and_reports_both_figures_side_by_side():
    h = FakeHarness(host_us={"auto": 12.0, "direct": 11.0, "fla.chunk_kda": 1066.0}, not_capturable={"fla.chunk_kda"})
    r = host_bench(h, peers="fla")
    assert r.exit_code == 0 and [run.shape for run in r.runs] == list(HOST_SHAPES)
    auto = r.runs[0].outcome("auto").host
    assert auto.eager_us == pytest.approx(12.0) and auto.replay_us == pytest.approx(1.2)
    assert not any(e.startswith("time:") or e == "flush" for e in h.events)  # no device timing in this mode
    head, body = r.rows()
    assert head[:3] == ["shape", "auto eager us", "auto replay us"]
    fla = head.index("fla.chunk_kda eager us")
    assert body[0][fla] == "1066.0 (88.83x)" and body[0][fla + 1] == "—"
    assert any("fla.chunk_kda: no replay figure: not capturable" in p for p in r.problems())
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["shapes"][0]["candidates"][0]["host"]["eager_us"] == pytest.approx(12.0)
    console = Console(record=True, width=250)
    r.render(console)
    text = console.export_text()
    assert "CPU us per call" in text and "of 20 calls issued back to back" in text and "bench: pass" in text
    assert "replay floor on this node (torch CUDA graph of one tiny kernel) 1.0 us" in text
    assert "plans kept by kdactl_host (cache)" in text and doc["info"]["replay_floor_us"] == 1.0


def test_host_mode_still_checks_first_and_never_measures_a_wrong_kernel():
    r = host_bench(FakeHarness(wrong={"direct"}), shapes=("1,64,4",))
    assert r.exit_code == 1 and r.runs[0].outcome("direct").host is None


def test_host_mode_refuses_the_gate_and_baselines():
    for opt in ("gate", "record_baseline"):
        with pytest.raises(UsageError, match="--host"):
            check_options(BenchOptions(host=True, **{opt: True}))
