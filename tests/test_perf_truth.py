"""The perf gate tells the truth: the default timer needs no extra install, a baseline of another
timer is inconclusive, a busy GPU is inconclusive (never failed), throttling warns, and the busy and
slow faults parse. All on the CPU with fakes."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from kdactl.bench import baseline as bl
from kdactl.bench import timing
from kdactl.bench.model import OK, Outcome, ShapeRun
from kdactl.bench.stats import summarize
from kdactl.bench.suites import Shape
from kdactl.certify.stages import judge_perf_activity, perf_results
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_PASS, Inconclusive
from kdactl.faults import is_active, parse_fault
from kdactl.hw.activity import Activity, Monitor, NvmlActivity, Sample, judge_activity, watched
from kdactl.results import CheckResult, verdict

A = Shape(1, 4096, 8)


def run_with(ms: float) -> ShapeRun:
    o = Outcome("auto", "auto", OK, note="auto -> small_bh (9 segments of 456 chunks per sequence, 16 lanes)")
    o.blocks = [[ms], [ms]]
    o.summary = summarize(o.blocks)
    return ShapeRun(A, [o])


def baseline(timer: str | None) -> bl.Baseline:
    return bl.Baseline("H200", 0.1, {A.label: bl.Entry(1.0, route="small_bh")}, {"timer": timer} if timer else {})


# --- the gate compares like with like ----------------------------------------------------------


def test_gate_with_the_baselines_timer_judges():
    rows = bl.gate([run_with(1.0)], baseline("kineto"), "kineto")
    assert [r.status for r in rows] == [bl.PASS] and bl.gate_exit(rows) == EXIT_PASS


@pytest.mark.parametrize("recorded", ["cupti", None])
def test_gate_with_another_timer_is_inconclusive_never_a_failure(recorded):
    # events include ~100 us of host launch overhead: 2.5x the kineto baseline, yet no regression
    rows = bl.gate([run_with(2.5)], baseline(recorded), "cuda-events")
    assert [r.status for r in rows] == [bl.TIMER_MISMATCH]
    assert bl.gate_exit(rows) == EXIT_INCONCLUSIVE
    assert "not comparable" in rows[0].message and "cuda-events" in rows[0].message
    results = perf_results(rows, EXIT_INCONCLUSIVE, [], "cuda-events")
    assert [r.status for r in results] == ["error"] and results[0].perf["timer"] == "cuda-events"
    assert verdict(results)[0] == "inconclusive"


def test_perf_results_record_the_timer():
    rows = bl.gate([run_with(1.0)], baseline("kineto"), "kineto")
    (r,) = perf_results(rows, EXIT_PASS, [], "kineto")
    assert r.status == "pass" and r.to_json()["timer"] == "kineto"


# --- timers ------------------------------------------------------------------------------------


class FakeEvent:
    def __init__(self, kind: str, ns: int, start: int = 0):
        self.kind, self.ns, self.start = kind, ns, start

    def activity_type(self) -> str:
        return self.kind

    def duration_ns(self) -> int:
        return self.ns

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.start + self.ns


def test_device_ns_sums_device_work_only():
    events = [FakeEvent("kernel", 1000), FakeEvent("gpu_memset", 200), FakeEvent("gpu_memcpy", 30),
              FakeEvent("cuda_runtime", 50000), FakeEvent("cpu_op", 90000), FakeEvent("gpu_user_annotation", 7)]
    assert timing.device_ns(events) == 1230


def test_device_span_counts_gaps_between_kernels_and_overlaps_once():
    # a host record before and after, two kernels 500 ns apart, a third starting inside the second
    events = [FakeEvent("cuda_runtime", 90000, start=0), FakeEvent("kernel", 1000, start=10000),
              FakeEvent("kernel", 2000, start=11500), FakeEvent("kernel", 1000, start=13000),
              FakeEvent("cpu_op", 90000, start=20000)]  # fmt: skip
    assert timing.device_span_ns(events) == 14000 - 10000
    assert timing.device_ns(events) == 4000  # the sum: gap uncounted, overlap twice
    assert timing.device_span_ns([FakeEvent("cpu_op", 5)]) == 0


def test_kineto_span_is_a_timer_by_name(monkeypatch):
    class Profile:  # torch.profiler.profile's shape: a context whose .profiler holds the records
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        class profiler:  # noqa: N801
            class kineto_results:  # noqa: N801
                @staticmethod
                def events():
                    return [FakeEvent("kernel", 1000, start=0), FakeEvent("kernel", 1000, start=3000)]

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    summed, span = timing.KinetoTimer("dev", profiler=Profile), timing.KinetoTimer("dev", profiler=Profile, span=True)
    assert (summed.name, span.name) == ("kineto", "kineto-span")
    assert summed.time_ms(lambda: None) == pytest.approx(0.002) and span.time_ms(lambda: None) == pytest.approx(0.004)
    monkeypatch.setattr(timing, "_probe", lambda t, d: None)
    monkeypatch.setattr(timing.KinetoTimer, "__init__", lambda self, d, profiler=None, span=False: setattr(self, "span", span))
    timer, note = timing.make_timer("dev", "kineto-span")
    assert timer.span is True and "span" in note


def test_default_timer_is_kineto(monkeypatch):
    made = []

    class Probe:
        name = "kineto"

        def __init__(self, device):
            made.append(device)

        def time_ms(self, fn):
            fn()
            return 0.01

    monkeypatch.setattr(timing, "KinetoTimer", Probe)
    monkeypatch.setattr(timing, "_probe", lambda t, d: t.time_ms(lambda: None))
    timer, note = timing.make_timer("dev")
    assert isinstance(timer, Probe) and made == ["dev"] and "kineto" in note


def test_broken_default_timer_falls_back_to_events_and_says_why(monkeypatch):
    def broken(device):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(timing, "KinetoTimer", broken)
    timer, note = timing.make_timer("dev")
    assert timer.name == "cuda-events" and "CUPTI_ERROR_NOT_INITIALIZED" in note


def test_a_timer_asked_for_by_name_is_that_timer_or_inconclusive(monkeypatch):
    def missing(device):
        raise ImportError("No module named 'cupti'")

    monkeypatch.setattr(timing, "CuptiTimer", missing)
    with pytest.raises(Inconclusive, match="cupti-python not installed"):
        timing.make_timer("dev", "cupti")


# --- a busy or throttled GPU -------------------------------------------------------------------


def test_activity_of_an_idle_gpu():
    samples = [Sample((), 0x1, False), Sample((100,), 0, True), Sample((100,), 0, True)]
    assert judge_activity(samples, own_pids=(100, 99)) == Activity(None, None)


def test_another_process_makes_the_gpu_busy():
    samples = [Sample((555,), 0, False), Sample((100, 555, 556), 0, True)]
    got = judge_activity(samples, own_pids=(100,))
    assert got.busy.startswith("GPU busy: 2 other processes") and "555, 556" in got.busy


def test_our_context_under_another_pid_namespace_is_not_a_co_tenant():
    # inside a container NVML shows the host's pid for our own context
    assert judge_activity([Sample((), 0, False), Sample((4242,), 0, True)], own_pids=(100,)).busy is None
    assert judge_activity([Sample((4242, 4243), 0, True)], own_pids=(100,)).busy.startswith("GPU busy: 1 other")
    # before we hold a context, every process is someone else's
    assert judge_activity([Sample((4242,), 0, False)], own_pids=(100,)).busy.startswith("GPU busy: 1 other")


def test_throttle_reasons_are_named():
    got = judge_activity([Sample((), 0x4, True), Sample((), 0x40 | 0x1, True)], own_pids=())
    assert got.busy is None and got.throttle == "clocks throttled while timed: software power cap, hardware thermal slowdown"
    assert judge_activity([Sample((), 0x1 | 0x2 | 0x10, True)], ()).throttle is None  # idle, app clocks, sync boost


def perf_rows(status: str = "fail") -> list[CheckResult]:
    return [CheckResult("perf[A]", status, "measured 2 ms, baseline 1 ms"), CheckResult("perf[B]", "pass", "ok")]


def test_busy_gpu_turns_a_slow_timing_into_inconclusive():
    out = judge_perf_activity(perf_rows("fail"), Activity("GPU busy: 6 other processes", None))
    assert [r.status for r in out] == ["error", "pass", "error"]
    assert "GPU busy: 6 other processes" in out[0].message and "measured 2 ms" in out[0].message
    assert verdict(out)[0] == "inconclusive"


def test_busy_gpu_still_fails_a_wrong_result():
    rows = perf_rows("pass") + [CheckResult("perf.reference_check", "fail", "auto: wrong result")]
    out = judge_perf_activity(rows, Activity("GPU busy: 1 other process", None))
    assert verdict(out)[0] == "not_certified"


def test_idle_gpu_keeps_the_gate_and_throttling_warns():
    out = judge_perf_activity(perf_rows("fail"), Activity(None, "clocks throttled while timed: hardware slowdown"))
    assert [(r.check, r.status) for r in out] == [("perf[A]", "fail"), ("perf[B]", "pass"), ("perf.activity", "pass"),
                                                  ("perf.throttle", "warn")]  # fmt: skip
    assert verdict(out)[0] == "not_certified"


class FakeActivityNvml:
    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND

    def __init__(self, compute=(), graphics=(), reasons=0x1, reasons_supported=True):
        self.compute, self.graphics, self.reasons, self.supported = compute, graphics, reasons, reasons_supported
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.graphics]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        if not self.supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.reasons


def test_nvml_sampler_reads_processes_and_reasons():
    lib = FakeActivityNvml(compute=(7, 8), graphics=(8, 9), reasons=0x8)
    s = NvmlActivity(0, lib).sample(True)
    assert s == Sample((7, 8, 9), 0x8, True)
    assert NvmlActivity(0, FakeActivityNvml(reasons_supported=False)).sample(False).reasons is None


def test_watched_samples_before_during_and_after():
    lib = FakeActivityNvml(compute=(31337,))
    value, samples, problems = watched(0, lambda: "done", lib)
    assert value == "done" and len(samples) >= 2 and not problems and lib.shut
    assert samples[0].ours_running is False and samples[-1].ours_running is True


def test_watched_without_nvml_still_runs_the_work_and_says_why():
    class NoNvml(FakeActivityNvml):
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    value, samples, problems = watched(0, lambda: 42, NoNvml())
    assert value == 42 and samples == [] and "libnvidia-ml" in problems[0]


def test_monitor_keeps_going_past_a_failed_sample():
    calls = []

    def sampler(running):
        calls.append(running)
        if len(calls) == 1:
            raise RuntimeError("NVML hiccup")
        return Sample((), 0, running)

    m = Monitor(sampler, period_s=0.01)
    m.start()
    samples = m.stop()
    assert m.errors == ["RuntimeError: NVML hiccup"] and samples and calls[0] is False


# --- the faults that prove it ------------------------------------------------------------------


def test_busy_and_slow_faults_parse():
    assert parse_fault("busy").kind == "busy" and parse_fault("slow").kind == "slow"
    assert is_active("slow", {"KDACTL_FAULT": "slow"}) and not is_active("slow", {"KDACTL_FAULT": "busy"})
    with pytest.raises(ValueError, match="busy, slow"):
        parse_fault("slowish")
    with pytest.raises(ValueError, match="'busy:3' is not a fault kdactl knows"):
        parse_fault("busy:3")


def test_recording_replaces_the_run_facts_whole():
    old = bl.Baseline("H200", 0.1, {}, {"timer": "cupti", "fla": "0.6.0", "note": "kept"})
    new = bl.record(old, [run_with(1.0)], "H200", {"timer": "kineto", "gpu": "NVIDIA H200"}, None)
    assert new.meta["timer"] == "kineto" and "fla" not in new.meta and new.meta["note"] == "kept"
