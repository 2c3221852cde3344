"""kdactl bench on a real GPU: the smoke suite end to end, the timers, and a wrong kernel caught
before it is timed. Marked gpu: skipped where torch sees no CUDA device."""

import json

import pytest

from kdactl.bench.progress import NullProgress
from kdactl.bench.runner import BenchOptions, run_bench
from kdactl.settings import Settings

pytestmark = pytest.mark.gpu


def _bench(**kw):
    kw.setdefault("iters", 4)
    kw.setdefault("warmup", 1)
    return run_bench(Settings.from_env(), BenchOptions(**kw), progress=NullProgress())


def test_smoke_suite_end_to_end():
    r = _bench(suite="smoke")
    doc = json.loads(json.dumps(r.to_json()))
    assert r.exit_code == 0, r.reasons
    assert doc["info"]["timer"] == "kineto", doc["info"]["timer_note"]  # the default needs no extra install
    l2 = doc["info"]["l2_bytes"] or 0
    assert doc["info"]["flush_bytes"] >= 2 * l2
    for shape in doc["shapes"]:
        auto = next(c for c in shape["candidates"] if c["name"] == "auto")
        assert auto["status"] == "ok", auto
        assert auto["check"]["o_err"] <= 5e-3 and auto["check"]["state_err"] <= 5e-3
        assert auto["timing"]["median_ms"] > 0 and auto["timing"]["samples"] >= 4
        assert auto["note"].startswith("auto -> ")
        for c in shape["candidates"]:
            assert c["status"] in ("ok", "rejected", "unavailable", "failed"), c
            if c["status"] != "ok":
                assert c["reason"]


def test_wrong_kernel_is_caught_not_timed(monkeypatch):
    import kdactl.kda as kda

    real = kda.prefill

    def wrong(*args, **kwargs):
        o, s = real(*args, **kwargs)
        o.mul_(1.1)
        return o, s

    monkeypatch.setattr(kda, "prefill", wrong)
    r = _bench(shapes=("1,256,2",), peers="none", routes="auto")
    auto = r.runs[0].outcome("auto")
    assert auto.status == "failed" and auto.summary is None
    assert r.exit_code == 1


def test_timers_measure_a_kernel():
    import torch

    from kdactl.bench.timing import EventTimer, L2Flusher, make_timer

    dev = torch.device("cuda", 0)
    a = torch.randn(2048, 2048, device=dev)
    flush = L2Flusher(dev, torch.cuda.get_device_properties(dev).L2_cache_size)
    flush()
    assert EventTimer(dev).time_ms(lambda: a @ a) > 0
    timer, note = make_timer(dev)
    assert timer.name == "kineto", note
    device_ms = timer.time_ms(lambda: a @ a)
    events_ms = EventTimer(dev).time_ms(lambda: a @ a)
    assert 0 < device_ms <= events_ms * 1.05  # device time leaves the host's launch cost out


@pytest.mark.parametrize("config", ["lower-bound", "softplus"])
def test_fused_configs_check_and_time_auto(config):
    r = _bench(shapes=("1,512,2",), varlens=("100,7,300",), heads=2, config=config, peers="none")
    assert r.exit_code == 0, r.reasons
    for run in r.runs:
        assert run.shape.key.startswith(f"{config}:")
        auto = run.outcome("auto")
        assert auto.status == "ok" and auto.check.o_err <= 5e-3 and auto.check.state_err <= 5e-3, auto
