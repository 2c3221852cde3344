"""kdactl.hw.nvml: the NVML adapter, over a fake pynvml that raises pynvml's own errors."""

from __future__ import annotations


import pynvml
import pytest

from kdactl.errors import Inconclusive, NoGpu
from kdactl.hw.nvml import NvmlUnavailable, PynvmlDriver
from tests.fakes import H200, L40S_LIKE, FakeNvml, fleet


def test_reads_every_fact_of_an_h200():
    info = PynvmlDriver(FakeNvml([H200])).read()
    assert (info.source, info.driver_version, info.cuda_driver) == ("nvml", "580.159.04", (13, 0))
    (g,) = info.gpus
    assert (g.index, g.uuid, g.name, g.memory_mib, g.cc, g.mig, g.ecc) == (
        0, "GPU-fa9f48df-e055-559c-fcd8-75aa44ae4541", "NVIDIA H200", 143771, (9, 0), "disabled", "enabled",
    )


def test_reads_gpus_in_nvml_index_order():
    info = PynvmlDriver(FakeNvml(fleet(H200, 8))).read()
    assert [g.index for g in info.gpus] == list(range(8))
    assert len({g.uuid for g in info.gpus}) == 8


@pytest.mark.parametrize("raw, version", [(13000, (13, 0)), (12080, (12, 8)), (12090, (12, 9)), (12040, (12, 4))])
def test_cuda_driver_version(raw, version):
    assert PynvmlDriver(FakeNvml([H200], cuda=raw)).read().cuda_driver == version


def test_cuda_driver_version_falls_back_to_v1():
    nvml = FakeNvml([H200], fail={"nvmlSystemGetCudaDriverVersion_v2": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
    assert PynvmlDriver(nvml).read().cuda_driver == (13, 0)


def test_mig_and_ecc_not_supported_are_none():
    info = PynvmlDriver(FakeNvml([L40S_LIKE])).read()
    assert (info.gpus[0].mig, info.gpus[0].ecc) == (None, None)


def test_bytes_from_old_bindings_are_decoded():
    class OldNvml(FakeNvml):
        def nvmlDeviceGetName(self, h):
            return h.name.encode()

        def nvmlSystemGetDriverVersion(self):
            return b"535.104.05"

    info = PynvmlDriver(OldNvml([H200])).read()
    assert info.driver_version == "535.104.05" and info.gpus[0].name == "NVIDIA H200"


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_is_nvml_unavailable(code):
    with pytest.raises(NvmlUnavailable, match="^no NVIDIA driver: NVML init failed") as err:
        PynvmlDriver(FakeNvml([], fail={"nvmlInit": code})).read()
    assert isinstance(err.value, NoGpu) and err.value.exit_code == 3


def test_other_init_errors_are_inconclusive_not_unavailable():
    nvml = FakeNvml([H200], fail={"nvmlInit": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH})
    with pytest.raises(Inconclusive, match="NVML init failed: RM has detected") as err:
        PynvmlDriver(nvml).read()
    assert not isinstance(err.value, NoGpu)


@pytest.mark.parametrize(
    "fn, code, words",
    [
        ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
        ("nvmlDeviceGetCudaComputeCapability", pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
        ("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
        ("nvmlDeviceGetMigMode", pynvml.NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
    ],
)
def test_device_errors_name_the_call_and_gpu(fn, code, words):
    nvml = FakeNvml([H200], fail={fn: code})
    with pytest.raises(Inconclusive, match=f"^NVML {fn} for GPU 0 failed: {words}"):
        PynvmlDriver(nvml).read()
    assert nvml.calls[-1] == "nvmlShutdown"  # shut down even on error


def test_system_error_names_the_call():
    nvml = FakeNvml([H200], fail={"nvmlSystemGetDriverVersion": pynvml.NVML_ERROR_UNINITIALIZED})
    with pytest.raises(Inconclusive, match="^NVML nvmlSystemGetDriverVersion failed: Uninitialized"):
        PynvmlDriver(nvml).read()


def test_failing_shutdown_does_not_lose_the_reading():
    nvml = FakeNvml([H200], fail={"nvmlShutdown": pynvml.NVML_ERROR_UNKNOWN})
    assert PynvmlDriver(nvml).read().gpus[0].name == "NVIDIA H200"


def test_real_pynvml_without_driver_is_unavailable():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        with pytest.raises(NvmlUnavailable):
            PynvmlDriver().read()
    else:
        pynvml.nvmlShutdown()
        assert PynvmlDriver().read().gpus
