"""kdactl.node: SKU classification, gather-once facts and the decisions made from them."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

from tests.fakes import B200, B300, CPU_TORCH, DATA, H20, H100_SXM, H200, NO_DRIVER, FakeNvml, FakeTorchCuda, fleet, providers, settings, smi_driver
from kdactl.errors import NoGpu, UsageError
from kdactl.hw.smi import QUERY_ARGS
from kdactl.node import classify_sku, detect_node, gather_node
from kdactl.skus import _RULES
from kdactl.skus import SKU_NAMES, load_skus

# ---------------------------------------------------------------------------------------------
# classify_sku: real NVML names


@pytest.mark.parametrize(
    "name, cc, sms, sku",
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), 132, "H100-SXM"),
        ("NVIDIA H100 SXM5 80GB", (9, 0), 132, "H100-SXM"),
        ("NVIDIA H100 PCIe", (9, 0), 114, "H100-PCIe"),
        ("NVIDIA H100", (9, 0), 132, "H100-SXM"),  # bare name: the SM count decides
        ("NVIDIA H100", (9, 0), 114, "H100-PCIe"),
        ("NVIDIA H100", (9, 0), 0, "unknown"),  # bare name, SM count unknown
        ("NVIDIA H100 NVL", (9, 0), 132, "unknown"),  # 94 GB at 3.9 TB/s: neither H100 row (docstring)
        ("NVIDIA H200", (9, 0), 132, "H200"),
        ("NVIDIA H200 NVL", (9, 0), 132, "H200"),
        ("NVIDIA B200", (10, 0), 148, "B200"),
        ("NVIDIA GB200", (10, 0), 152, "GB200"),
        ("NVIDIA B300 SXM6 AC", (10, 3), 148, "B300"),
        ("NVIDIA GB300", (10, 3), 152, "GB300"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), 108, "A100"),
        ("NVIDIA A100-SXM4-40GB", (8, 0), 108, "A100"),
        ("NVIDIA A100-PCIE-40GB", (8, 0), 108, "A100"),
        ("NVIDIA A100 80GB PCIe", (8, 0), 108, "A100"),
        ("NVIDIA L40S", (8, 9), 142, "L40S"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 188, "RTX-PRO-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", (12, 0), 188, "RTX-PRO-6000"),
        # look-alikes that are not fleet SKUs
        ("NVIDIA H20", (9, 0), 78, "unknown"),
        ("NVIDIA GH200 480GB", (9, 0), 132, "unknown"),
        ("NVIDIA H800", (9, 0), 132, "unknown"),
        ("NVIDIA A800-SXM4-80GB", (8, 0), 108, "unknown"),
        ("NVIDIA L40", (8, 9), 142, "unknown"),
        ("NVIDIA RTX 6000 Ada Generation", (8, 9), 142, "unknown"),
        ("NVIDIA GeForce RTX 4090", (8, 9), 128, "unknown"),
        ("Tesla V100-SXM2-32GB", (7, 0), 80, "unknown"),
        ("", (9, 0), 132, "unknown"),
    ],
)
def test_classify_sku_real_names(name, cc, sms, sku):
    assert classify_sku(name, cc, sms) == sku


@pytest.mark.parametrize(
    "name, cc",
    [
        ("NVIDIA H200", (8, 0)),
        ("NVIDIA H100 80GB HBM3", (10, 0)),
        ("NVIDIA B200", (10, 3)),
        ("NVIDIA B300 SXM6 AC", (10, 0)),
        ("NVIDIA GB300", (10, 0)),
        ("NVIDIA A100-SXM4-80GB", (8, 6)),
        ("NVIDIA L40S", (9, 0)),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (10, 0)),
    ],
)
def test_classify_sku_mismatching_cc_is_unknown(name, cc):
    assert classify_sku(name, cc, 132) == "unknown"


def test_classify_sku_returns_only_spec_names():
    for sku, _, _ in _RULES:
        assert sku in SKU_NAMES or sku == "H100"


def test_rules_agree_with_the_sku_matrix():
    """classify_sku's cc per family is the matrix's cc, and every SPEC SKU has a matrix row."""
    matrix = load_skus()
    assert set(matrix) == set(SKU_NAMES)
    for sku, _, cc in _RULES:
        rows = [s for s in matrix.values() if s.name == sku or (sku == "H100" and s.name.startswith("H100-"))]
        assert rows and all(r.cc == cc for r in rows), sku


# ---------------------------------------------------------------------------------------------
# gather_node / detect_node


def test_h200_node():
    facts = gather_node(settings(), providers([H200]))
    (g,) = facts.gpus
    assert (g.sku, g.cc, g.sm_count, g.target) == ("H200", (9, 0), 132, "sm_90a")
    assert (g.memory_mib, g.l2_bytes, g.mig, g.ecc) == (143771, 62914560, "disabled", "enabled")
    assert g.target_reason == "cc 9.0 with CUDA toolkit 13.0 (nvcc)"
    assert facts.target == "sm_90a"
    assert facts.toolkit.version == (13, 0) and facts.cuda_driver == (13, 0)
    assert facts.warnings == () and facts.error is None
    report = detect_node(settings(), providers([H200]))
    assert report.exit_code == 0
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["gpus"][0]["cc"] == "9.0" and doc["gpus"][0]["uuid"] == H200.uuid
    assert doc["node"]["cuda_driver_version"] == "13.0" and doc["node"]["driver_version"] == "580.159.04"
    assert doc["node"]["cuda_toolkit"]["version"] == "13.0" and doc["node"]["torch"]["cuda"] == "13.0"
    assert doc["exit_code"] == 0 and doc["error"] is None


def test_no_driver_is_inconclusive_with_node_facts():
    p = providers([], nvml=FakeNvml([], fail=NO_DRIVER), torch=CPU_TORCH)
    facts = gather_node(settings(), p)
    assert facts.gpus == () and "no NVIDIA driver" in facts.error and "nvidia-smi" in facts.error
    assert "\n" not in facts.error
    with pytest.raises(NoGpu, match="no NVIDIA driver"):
        facts.require_gpus()
    report = detect_node(settings(), p)
    assert report.exit_code == 3
    doc = report.to_json()
    assert doc["node"]["host_arch"] == "x86_64" and doc["node"]["torch"]["version"] == "2.13.0+cpu"
    assert doc["node"]["cuda_toolkit"]["version"] == "13.0" and doc["error"] == facts.error


def test_driver_with_zero_gpus_is_inconclusive():
    report = detect_node(settings(), providers([], torch=CPU_TORCH))
    assert report.exit_code == 3 and "reports 0 GPUs" in report.reason


def test_nvml_error_on_a_gpu_is_inconclusive_not_a_crash():
    import pynvml

    nvml = FakeNvml([H200], fail={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_GPU_IS_LOST})
    report = detect_node(settings(), providers([H200], nvml=nvml))
    assert report.exit_code == 3 and report.reason == "NVML nvmlDeviceGetUUID for GPU 0 failed: GPU is lost"


def test_mixed_node_is_flagged_and_reported_per_gpu():
    gpus = fleet(H200, 4) + fleet(H100_SXM, 4)
    facts = gather_node(settings(), providers(gpus))
    assert [g.sku for g in facts.gpus] == ["H200"] * 4 + ["H100-SXM"] * 4
    assert facts.target == "sm_90a"
    (mixed,) = [w for w in facts.warnings if "mixed" in w]
    assert "4x NVIDIA H200 (GPU 0,1,2,3)" in mixed and "4x NVIDIA H100 80GB HBM3 (GPU 4,5,6,7)" in mixed
    assert detect_node(settings(), providers(gpus)).exit_code == 0


def test_mixed_targets_leave_node_target_empty():
    facts = gather_node(settings(), providers([H200, replace(B200, uuid="GPU-b")]))
    assert [g.target for g in facts.gpus] == ["sm_90a", "sm_100f"] and facts.target is None


def test_driver_older_than_toolkit_warns():
    facts = gather_node(settings(), providers([H200], nvml=FakeNvml([H200], cuda=12040), torch=FakeTorchCuda([H200], cuda="12.4")))
    assert any("driver supports CUDA 12.4, older than the CUDA toolkit 13.0" in w for w in facts.warnings)
    assert facts.gpus[0].target == "sm_90a"


def test_torch_newer_than_driver_warns():
    facts = gather_node(settings(), providers([H200], nvml=FakeNvml([H200], cuda=12080), cuda_toolkit=(12, 8)))
    assert any("built for CUDA 13.0, newer than the driver's CUDA 12.8" in w for w in facts.warnings)


def test_cuda_arch_override():
    s = settings(KDACTL_CUDA_ARCH="sm_100f")
    facts = gather_node(s, providers([H200]))
    assert facts.gpus[0].target == "sm_100f" and facts.gpus[0].target_reason == "KDACTL_CUDA_ARCH=sm_100f"
    assert any("KDACTL_CUDA_ARCH=sm_100f does not run on compute capability 9.0" in w for w in facts.warnings)
    same = gather_node(settings(KDACTL_CUDA_ARCH="sm_90a"), providers([H200]))
    assert same.gpus[0].target == "sm_90a" and same.warnings == ()


def test_unknown_cuda_arch_override_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown kernel target 'sm_91'"):
        gather_node(settings(KDACTL_CUDA_ARCH="sm_91"), providers([H200]))


def test_unsupported_target_is_inconclusive_with_reason():
    report = detect_node(settings(), providers([B300], cuda_toolkit=(12, 8), nvml=FakeNvml([B300], cuda=12080)))
    g = report.facts.gpus[0]
    assert g.sku == "B300" and g.target is None and "12.9" in g.target_reason
    assert report.exit_code == 3 and report.reason.startswith("GPU 0 (NVIDIA B300 SXM6 AC): no kernel target:")


def test_no_toolkit_chooses_by_driver_cuda_and_warns():
    facts = gather_node(settings(), providers([B200], cuda_toolkit=None))
    assert facts.toolkit is None and facts.gpus[0].target == "sm_100f"
    assert "driver's CUDA 13.0" in facts.gpus[0].target_reason
    assert any(w.startswith("nvcc not found") for w in facts.warnings)


def test_sku_not_in_matrix_warns_not_fails():
    report = detect_node(settings(), providers([H20]))
    assert report.facts.gpus[0].sku == "unknown" and report.exit_code == 0
    assert any("SKU 'unknown' (cc 9.0, 78 SMs) is not in fleet/skus.toml" in w for w in report.facts.warnings)


def test_sm_count_differing_from_matrix_warns():
    odd = replace(H200, sm_count=114)
    facts = gather_node(settings(), providers([odd]))
    assert facts.gpus[0].sku == "H200"
    assert "GPU 0 (NVIDIA H200): actual 114 SMs, expected 132 for H200 (fleet/skus.toml)" in facts.warnings


def test_torch_devices_are_matched_by_uuid_not_order():
    gpus = [H200, replace(H100_SXM, uuid="GPU-aaaa")]
    facts = gather_node(settings(), providers(gpus, torch=FakeTorchCuda(list(reversed(gpus)))))
    assert [(g.name, g.sm_count) for g in facts.gpus] == [("NVIDIA H200", 132), ("NVIDIA H100 80GB HBM3", 132)]
    assert [g.l2_bytes for g in facts.gpus] == [62914560, 52428800]


def test_torch_without_gpus_warns_and_keeps_target():
    facts = gather_node(settings(), providers([H200], torch=CPU_TORCH))
    g = facts.gpus[0]
    assert g.sm_count is None and g.sku == "H200" and g.target == "sm_90a"
    assert any("CPU-only build" in w for w in facts.warnings)


def test_nvidia_smi_fallback_when_nvml_cannot_load():
    smi = smi_driver(
        {QUERY_ARGS: (0, (DATA / "nvidia-smi-query-h200.csv").read_text(), ""), (): (0, (DATA / "nvidia-smi-h200.txt").read_text(), "")}
    )
    facts = gather_node(settings(), providers([H200], nvml=FakeNvml([], fail=NO_DRIVER), smi=smi))
    assert facts.driver_source == "nvidia-smi" and facts.cuda_driver == (13, 0) and facts.driver_version == "580.159.04"
    assert [(g.sku, g.sm_count, g.target) for g in facts.gpus] == [("H200", 132, "sm_90a")]


def test_nvml_errors_other_than_no_driver_do_not_fall_back():
    import pynvml

    nvml = FakeNvml([H200], fail={"nvmlInit": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH})
    facts = gather_node(settings(), providers([H200], nvml=nvml, smi=smi_driver({})))
    assert facts.error == "NVML init failed: RM has detected an NVML/RM version mismatch."


def test_render_shows_table_and_warnings():
    report = detect_node(settings(), providers([H200, replace(H20, uuid="GPU-h20")]))
    buf = io.StringIO()
    report.render(Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    for needle in ("x86_64", "580.159.04", "13.0", "H200", "sm_90a", "132", "140.4 GiB", "60 MiB", "warning:", "mixed GPU models"):
        assert needle in text, needle
