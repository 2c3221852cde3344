"""kdactl.hw.cuda_torch: torch's view, over a stand-in torch module and the real CPU torch."""

from __future__ import annotations

from types import SimpleNamespace

from kdactl.hw.cuda_torch import TorchCuda, normalize_uuid


def _fake_torch(devices, cuda="13.0", fail=None):
    def props(i):
        return devices[i]

    def count():
        if fail:
            raise RuntimeError(fail)
        return len(devices)

    return SimpleNamespace(
        __version__="2.11.0+cu130",
        version=SimpleNamespace(cuda=cuda),
        cuda=SimpleNamespace(device_count=count, get_device_properties=props),
    )


H200_PROPS = SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=62914560, uuid="fa9f48df-e055-559c-fcd8-75aa44ae4541")


def test_reads_sm_count_l2_and_uuid():
    info = TorchCuda(_fake_torch([H200_PROPS])).read()
    assert (info.version, info.cuda, info.problem) == ("2.11.0+cu130", "13.0", None)
    (d,) = info.devices
    assert (d.index, d.name, d.sm_count, d.l2_bytes, d.uuid) == (0, "NVIDIA H200", 132, 62914560, "fa9f48df-e055-559c-fcd8-75aa44ae4541")


def test_cpu_build_and_no_devices_say_why():
    assert TorchCuda(_fake_torch([], cuda=None)).read().problem == "torch 2.11.0+cu130 is a CPU-only build"
    assert "sees no GPU" in TorchCuda(_fake_torch([])).read().problem


def test_cuda_init_error_is_a_problem_not_a_crash():
    info = TorchCuda(_fake_torch([H200_PROPS], fail="CUDA driver initialization failed")).read()
    assert info.devices == () and info.problem == "torch.cuda failed: RuntimeError: CUDA driver initialization failed"


def test_real_torch_reads():
    import torch

    info = TorchCuda().read()
    assert info.version == str(torch.__version__)
    assert len(info.devices) == (torch.cuda.device_count() if torch.version.cuda else 0)


def test_normalize_uuid():
    assert normalize_uuid("GPU-FA9F48DF-e055") == "fa9f48df-e055" == normalize_uuid("fa9f48df-E055")
