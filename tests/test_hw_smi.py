"""kdactl.hw.smi: the nvidia-smi fallback, parsed from recorded output (tests/data/)."""

from __future__ import annotations

import subprocess

import pytest

from kdactl.errors import Inconclusive, NoGpu
from kdactl.hw.smi import QUERY_ARGS, SmiDriver, parse_cuda_version, parse_query_csv
from tests.fakes import DATA, FakeRunner, smi_driver

H200_CSV = (DATA / "nvidia-smi-query-h200.csv").read_text()
H200_PLAIN = (DATA / "nvidia-smi-h200.txt").read_text()


def test_parse_recorded_h200():
    driver, gpus = parse_query_csv(H200_CSV)
    assert driver == "580.159.04"
    (g,) = gpus
    assert (g.index, g.uuid, g.name, g.memory_mib, g.cc, g.mig, g.ecc) == (
        0, "GPU-fa9f48df-e055-559c-fcd8-75aa44ae4541", "NVIDIA H200", 143771, (9, 0), "disabled", "enabled",
    )


def test_parse_two_l40s_with_mig_not_available():
    driver, gpus = parse_query_csv((DATA / "nvidia-smi-query-l40s-x2.csv").read_text())
    assert driver == "570.133.20"
    assert [(g.index, g.name, g.cc, g.mig, g.ecc) for g in gpus] == [
        (0, "NVIDIA L40S", (8, 9), None, "enabled"),
        (1, "NVIDIA L40S", (8, 9), None, "enabled"),
    ]


def test_cuda_version_from_plain_output():
    assert parse_cuda_version(H200_PLAIN) == (13, 0)
    assert parse_cuda_version("CUDA Version                     : 12.8") == (12, 8)
    assert parse_cuda_version("no header here") is None


def test_empty_output_is_no_gpus():
    assert parse_query_csv("") == (None, ())


@pytest.mark.parametrize(
    "text, words",
    [
        ("0, GPU-x, NVIDIA H200, 143771, 9.0", "line 1: expected 8 fields, got 5"),
        ("0, GPU-x, NVIDIA H200, lots, 9.0, Disabled, Enabled, 580.1", "line 1:"),
        ("0, GPU-x, NVIDIA H200, 143771, [N/A], Disabled, Enabled, 580.1", "line 1:"),
    ],
)
def test_unreadable_output_is_inconclusive(text, words):
    with pytest.raises(Inconclusive, match=f"cannot read nvidia-smi output {words}"):
        parse_query_csv(text)


def test_two_driver_versions_is_inconclusive():
    text = H200_CSV + H200_CSV.replace("0, GPU-", "1, GPU-").replace("580.159.04", "580.1")
    with pytest.raises(Inconclusive, match="more than one driver version"):
        parse_query_csv(text)


def test_smi_driver_reads_both_commands():
    runner = FakeRunner({QUERY_ARGS: (0, H200_CSV, ""), (): (0, H200_PLAIN, "")})
    info = SmiDriver(run=runner, which=lambda _: "/usr/bin/nvidia-smi").read()
    assert (info.source, info.driver_version, info.cuda_driver, len(info.gpus)) == ("nvidia-smi", "580.159.04", (13, 0), 1)
    assert runner.calls[0] == ["/usr/bin/nvidia-smi", *QUERY_ARGS]


def test_missing_nvidia_smi_is_no_gpu():
    with pytest.raises(NoGpu, match="nvidia-smi not found on PATH"):
        smi_driver({}, which=None).read()


def test_driver_not_loaded_is_no_gpu():
    said = (DATA / "nvidia-smi-no-driver.txt").read_text()
    with pytest.raises(NoGpu, match="^nvidia-smi says: NVIDIA-SMI has failed because it couldn't communicate"):
        smi_driver({QUERY_ARGS: (9, said, "")}).read()


def test_other_failures_are_inconclusive():
    with pytest.raises(Inconclusive, match="exited 15"):
        smi_driver({QUERY_ARGS: (15, "", "Unable to determine the device handle for GPU0000:00:06.0: Unknown Error")}).read()
    with pytest.raises(Inconclusive, match="timed out after 30 s"):
        smi_driver({QUERY_ARGS: subprocess.TimeoutExpired("nvidia-smi", 30)}).read()
