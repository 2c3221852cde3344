"""The real stage functions, with the suite, sanitizer and bench entry points replaced by fakes."""

from types import SimpleNamespace

import pytest

from kdactl.certify import stages
from kdactl.certify.stages import StageContext, perf_results
from kdactl.results import CheckResult
from tests import certify_fakes as cf


def ctx(tmp_path, quick=False, gpu=3, sku="H200"):
    return StageContext(cf.settings(tmp_path), gpu, "sm_90a", sku, quick)


def test_suite_stage_passes_the_node_index_and_quick(tmp_path, monkeypatch):
    import kdactl.suite

    seen = {}
    monkeypatch.setattr(kdactl.suite, "run_suite", lambda gpu, **kw: seen.update(gpu=gpu, **kw) or [CheckResult("x", "pass")])
    assert stages.suite_stage(ctx(tmp_path, quick=True))[0].status == "pass"
    assert seen["gpu"] == 3 and seen["quick"] is True and seen["timeout_s"] == stages.SUITE_TIMEOUT_S[True]


def test_suite_and_sanitizers_see_the_workers_gpu_uuid(tmp_path, monkeypatch):
    import kdactl.sanitizer.run
    import kdactl.suite

    seen = {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fa9f48df")  # as the orchestrator sets it
    monkeypatch.setattr(kdactl.suite, "run_suite", lambda gpu, **kw: seen.update(suite=kw["visible"]) or [CheckResult("x", "pass")])
    monkeypatch.setattr(kdactl.sanitizer.run, "run_sanitizers", lambda s, **kw: seen.update(sanitize=kw["visible"]) or [CheckResult("y", "pass")])
    stages.suite_stage(ctx(tmp_path))
    stages.sanitize_stage(ctx(tmp_path))
    assert seen == {"suite": "GPU-fa9f48df", "sanitize": "GPU-fa9f48df"}


@pytest.mark.parametrize("quick,tools", [(True, ("memcheck",)), (False, ("memcheck", "synccheck", "racecheck", "initcheck"))])
def test_sanitize_stage_tools(tmp_path, monkeypatch, quick, tools):
    import kdactl.sanitizer.run

    seen = {}
    monkeypatch.setattr(kdactl.sanitizer.run, "run_sanitizers", lambda s, **kw: seen.update(kw) or [CheckResult("sanitize.memcheck", "pass")])
    stages.sanitize_stage(ctx(tmp_path, quick=quick))
    assert tuple(seen["tools"]) == tools and seen["gpu"] == 3


def test_perf_stage_without_baseline_is_required_skip(tmp_path):
    (r,) = stages.perf_stage(ctx(tmp_path, sku="RTX-PRO-6000"))
    assert r.status == "skip" and r.required and "record-baseline" in r.message
    (r,) = stages.perf_stage(ctx(tmp_path, sku="unknown"))
    assert r.status == "skip" and "no baseline" in r.message


def row(label, status, measured=1.0):
    return SimpleNamespace(label=label, status=status, measured_ms=measured, baseline_ms=0.9, threshold_ms=0.99, message=f"{label} {status}")


def test_perf_results_mapping():
    rows = [row("A", "pass"), row("B", "regressed"), row("C", "slower-within-noise"), row("D", "not-measured", None),
            row("E", "route-changed")]  # fmt: skip
    out = perf_results(rows, 1, [])
    assert [(r.check, r.status) for r in out] == [("perf[A]", "pass"), ("perf[B]", "fail"), ("perf[C]", "warn"),
                                                  ("perf[D]", "error"), ("perf[E]", "warn")]  # fmt: skip
    assert out[0].to_json()["unit"] == "ms" and out[0].to_json()["baseline"] == 0.9


def test_perf_wrong_result_fails_even_without_regression():
    out = perf_results([row("A", "not-measured", None)], 1, ["B1: auto failed: wrong result"])
    assert out[-1].check == "perf.reference_check" and out[-1].status == "fail"
    assert perf_results([], 3, [])[0].status == "error"


def test_build_stage_without_gpu_is_an_error_in_the_worker(tmp_path):
    import argparse

    from kdactl.certify import worker

    args = argparse.Namespace(stage="build", impl="kdactl.certify.stages:nonexistent", gpu=0, target="sm_90a", sku="H200",
                              quick=False, result=tmp_path / "r.json")  # fmt: skip
    (r,) = worker.run(args)
    assert r["status"] == "error" and "AttributeError" in r["message"]


def test_host_module_check_passes_warns_when_unavailable_or_disabled(tmp_path, monkeypatch):
    import dataclasses
    from pathlib import Path

    import kdactl.jit.host as host
    from kdactl.errors import BuildError

    entry = SimpleNamespace(library=Path("/c/libkdactl_host.so"), built=True, build_s=21.5)
    monkeypatch.setattr(host, "load_host_module", lambda settings, target: (object(), entry))
    r = stages.host_module_check(ctx(tmp_path))
    assert (r.check, r.status, r.message) == ("host-module", "pass", "/c/libkdactl_host.so (built in 21.5 s)")

    def fail(settings, target):
        raise BuildError("nvcc failed for sm_90a: Python.h: No such file")

    monkeypatch.setattr(host, "load_host_module", fail)
    r = stages.host_module_check(ctx(tmp_path))
    assert r.status == "warn" and "keep their plans in Python: nvcc failed" in r.message
    off = StageContext(dataclasses.replace(cf.settings(tmp_path), env={"KDACTL_HOST_MODULE": "0"}), 0, "sm_90a", "H200", False)
    r = stages.host_module_check(off)
    assert r.status == "warn" and r.message.startswith("KDACTL_HOST_MODULE=0")
