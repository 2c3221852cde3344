"""Shared fakes: stand-ins for NVML, torch.cuda, nvcc and subprocess that tests hand to providers.

FakeNvml raises the real ``pynvml.NVMLError`` subclasses, so the adapter's error mapping is tested
against the vendor's own exception types.
"""

from __future__ import annotations

import subprocess
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pynvml

from kdactl.hw.cuda_torch import TorchDevice, TorchInfo, normalize_uuid
from kdactl.hw.nvml import PynvmlDriver
from kdactl.hw.providers import Providers
from kdactl.hw.smi import SmiDriver
from kdactl.hw.toolkit import Toolkit
from kdactl.settings import Settings
from kdactl.skus import load_skus

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class FakeGpu:
    name: str
    cc: tuple[int, int]
    sm_count: int
    memory_mib: int
    l2_bytes: int
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    mig: int | None = 0  # NVML current mode; None: NOT_SUPPORTED
    ecc: int | None = 1


# As an H200 of this project's lent machine reported them (tests/data/nvidia-smi-*-h200.*).
H200 = FakeGpu("NVIDIA H200", (9, 0), 132, 143771, 62914560, "GPU-fa9f48df-e055-559c-fcd8-75aa44ae4541")
H100_SXM = FakeGpu("NVIDIA H100 80GB HBM3", (9, 0), 132, 81559, 52428800)
B200 = FakeGpu("NVIDIA B200", (10, 0), 148, 183359, 132644864)
B300 = FakeGpu("NVIDIA B300 SXM6 AC", (10, 3), 148, 275040, 132644864)
L40S_LIKE = FakeGpu("NVIDIA L40S", (8, 9), 142, 46068, 100663296, "GPU-3b6a1c52", mig=None, ecc=None)
H20 = FakeGpu("NVIDIA H20", (9, 0), 78, 97871, 62914560)


def fleet(gpu: FakeGpu, n: int) -> list[FakeGpu]:
    """n copies of one model with distinct UUIDs."""
    tag = zlib.crc32(gpu.name.encode())
    return [replace(gpu, uuid=f"GPU-{i:08x}-1111-2222-3333-{tag:012x}") for i in range(n)]


class FakeNvml:
    """The slice of the pynvml module kdactl uses. ``fail`` maps a function name to an NVML error code
    (pynvml.NVML_ERROR_*) that the function raises."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], driver: str = "580.159.04", cuda: int = 13000, fail: dict[str, int] | None = None):
        self.gpus, self.driver, self.cuda, self.fail = gpus, driver, cuda, dict(fail or {})
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:  # NVML_ERROR_* constants come from the real module
        if name.startswith("NVML_"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self, fn: str) -> None:
        self.calls.append(fn)
        if fn in self.fail:
            raise pynvml.NVMLError(self.fail[fn])

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID")
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName")
        return h.name

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=h.memory_mib << 20, free=h.memory_mib << 20, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability")
        return h.cc

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetMigMode")
        if h.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [h.mig, h.mig]

    def nvmlDeviceGetEccMode(self, h: FakeGpu) -> list[int]:
        self._enter("nvmlDeviceGetEccMode")
        if h.ecc is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [h.ecc, h.ecc]


NO_DRIVER = {"nvmlInit": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}


class FakeTorchCuda:
    """TorchCudaProvider: torch sees ``gpus`` (in this order), or nothing with ``problem``."""

    def __init__(self, gpus: list[FakeGpu], version: str = "2.11.0+cu130", cuda: str | None = "13.0", problem: str | None = None):
        self.info = TorchInfo(
            version=version,
            cuda=cuda,
            devices=tuple(TorchDevice(i, normalize_uuid(g.uuid), g.name, g.sm_count, g.l2_bytes) for i, g in enumerate(gpus)),
            problem=problem,
        )

    def read(self) -> TorchInfo:
        return self.info


CPU_TORCH = FakeTorchCuda([], version="2.13.0+cpu", cuda=None, problem="torch 2.13.0+cpu is a CPU-only build")


class FakeRunner:
    """subprocess.run stand-in: argv[1:] (as a tuple) -> (returncode, stdout, stderr) or an exception."""

    def __init__(self, responses: dict[tuple[str, ...], tuple[int, str, str] | BaseException]):
        self.responses = responses
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        answer = self.responses[tuple(argv[1:])]
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return subprocess.CompletedProcess(argv, rc, out, err)


def smi_driver(responses: dict | None, which: str | None = "/usr/bin/nvidia-smi") -> SmiDriver:
    """An SmiDriver over FakeRunner; ``which=None`` means nvidia-smi is not installed."""
    return SmiDriver(run=FakeRunner(responses or {}), which=lambda _exe: which)


def toolkit(version: tuple[int, int] | None = (13, 0)) -> Callable[[], Toolkit]:
    def find() -> Toolkit:
        if version is None:
            from kdactl.errors import ToolMissing

            raise ToolMissing("nvcc not found (looked for 'nvcc' on PATH; set KDACTL_NVCC or install the CUDA toolkit)")
        return Toolkit("/usr/local/cuda/bin/nvcc", version, f"Build cuda_{version[0]}.{version[1]}.r{version[0]}.{version[1]}/compiler.0_0")

    return find


def providers(
    gpus: list[FakeGpu] | None = None,
    *,
    nvml: FakeNvml | None = None,
    torch: Any = None,
    cuda_toolkit: tuple[int, int] | None = (13, 0),
    smi: SmiDriver | None = None,
    machine: str = "x86_64",
) -> Providers:
    gpus = [H200] if gpus is None else gpus
    return Providers(
        driver=PynvmlDriver(nvml or FakeNvml(gpus)),
        fallback=smi if smi is not None else smi_driver(None, which=None),
        torch=torch if torch is not None else FakeTorchCuda(gpus),
        toolkit=toolkit(cuda_toolkit),
        machine=lambda: machine,
        skus=load_skus,
    )


def settings(**env: str) -> Settings:
    return Settings.from_env({"HOME": "/nonexistent", **env})


def write_fake_nvcc(directory: Path, *, sleep_s: float = 0.0, hang: bool = False, pid_file: Path | None = None,
                    ignore_term: bool = False, error: str = "") -> Path:  # fmt: skip
    """An executable stand-in for nvcc: answers --version as CUDA 13.0 does, and for a compile or
    link writes a small file at its -o path after ``sleep_s``. ``pid_file``: each call appends its
    pid; ``hang``: it never finishes (exec sleep, same pid); ``ignore_term``: SIGTERM and SIGINT
    do not stop it, only SIGKILL does; ``error``: it prints that line and fails."""
    script = directory / "nvcc"
    lines = [
        "#!/bin/sh",
        'if [ "$1" = "--version" ]; then',
        "  echo 'nvcc: NVIDIA (R) Cuda compiler driver'",
        "  echo 'Cuda compilation tools, release 13.0, V13.0.48'",
        "  echo 'Build cuda_13.0.r13.0/compiler.fake_0'",
        "  exit 0",
        "fi",
        "trap '' TERM INT" if ignore_term else "",
        f"echo $$ >> '{pid_file}'" if pid_file else "",
        "exec sleep 600" if hang else "",
        f"echo '{error}' >&2; exit 1" if error else "",
        f"sleep {sleep_s}" if sleep_s else "",
        'out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done',
        "echo \"fake object $out\" > \"$out\"",
    ]
    script.write_text("\n".join(line for line in lines if line) + "\n")
    script.chmod(0o755)
    return script


def process_running(pid: int) -> bool:
    """Alive and not a zombie: a fake's process that was ended may wait long for a reaper (here,
    PID 1 of a container may never reap it)."""
    from kdactl.proc import parse_proc_stat

    try:
        return parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())[0] != "Z"
    except OSError:
        return False
