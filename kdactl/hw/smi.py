"""The nvidia-smi fallback, used only when NVML cannot be loaded. Parsing is pure and tested with
recorded output (tests/data/nvidia-smi-*)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable

from kdactl.errors import Inconclusive, NoGpu
from kdactl.hw.driver import DriverGpu, DriverInfo

Runner = Callable[..., subprocess.CompletedProcess]

QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "compute_cap",
    "mig.mode.current",
    "ecc.mode.current",
    "driver_version",
)
QUERY_ARGS = ("--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits")
_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")
_ABSENT = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", ""}
# nvidia-smi's own words for "there is no driver or no GPU" (it exits non-zero with these).
_NO_GPU_MARKERS = (
    "couldn't communicate with the NVIDIA driver",
    "No devices were found",
    "NVIDIA driver is not loaded",
)
TIMEOUT_S = 30


def parse_query_csv(text: str) -> tuple[str | None, tuple[DriverGpu, ...]]:
    """``--query-gpu=QUERY_FIELDS --format=csv,noheader,nounits`` -> (driver version, GPUs)."""
    gpus, drivers = [], set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise Inconclusive(
                f"cannot read nvidia-smi output line {lineno}: expected {len(QUERY_FIELDS)} fields, got {len(cells)}: {line.strip()[:160]!r}"
            )
        index, uuid, name, mem, cc, mig, ecc, driver = cells
        try:
            major, minor = cc.split(".")
            gpus.append(
                DriverGpu(
                    index=int(index),
                    uuid=uuid,
                    name=name,
                    memory_mib=int(float(mem)),
                    cc=(int(major), int(minor)),
                    mig=_mode(mig),
                    ecc=_mode(ecc),
                )
            )
        except ValueError:
            raise Inconclusive(f"cannot read nvidia-smi output line {lineno}: {line.strip()[:160]!r}") from None
        drivers.add(driver)
    if len(drivers) > 1:
        raise Inconclusive(f"nvidia-smi reports more than one driver version: {sorted(drivers)}")
    return (drivers.pop() if drivers else None), tuple(gpus)


def parse_cuda_version(text: str) -> tuple[int, int] | None:
    """The 'CUDA Version: 13.0' of plain ``nvidia-smi`` (or ``-q``); None when absent."""
    m = _CUDA_VERSION.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _mode(cell: str) -> str | None:
    return None if cell in _ABSENT else cell.lower()


class SmiDriver:
    """DriverProvider over the nvidia-smi program."""

    def __init__(
        self, exe: str = "nvidia-smi", run: Runner = subprocess.run, which: Callable[[str], str | None] = shutil.which
    ):
        self.exe, self._run, self._which = exe, run, which

    def read(self) -> DriverInfo:
        path = self._which(self.exe)
        if path is None:
            raise NoGpu(f"{self.exe} not found on PATH")
        driver, gpus = parse_query_csv(self._output(path, *QUERY_ARGS))
        cuda = parse_cuda_version(self._output(path))
        return DriverInfo(source="nvidia-smi", driver_version=driver or "unknown", cuda_driver=cuda, gpus=gpus)

    def _output(self, path: str, *args: str) -> str:
        argv = [path, *args]
        try:
            proc = self._run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Inconclusive(f"{' '.join(argv)} timed out after {TIMEOUT_S} s") from None
        except OSError as err:
            raise Inconclusive(f"cannot run {path}: {err}") from None
        if proc.returncode != 0:
            said = (proc.stdout + proc.stderr).strip()
            if any(marker in said for marker in _NO_GPU_MARKERS):
                raise NoGpu(f"nvidia-smi says: {said.splitlines()[0]}")
            raise Inconclusive(f"{' '.join(argv)} exited {proc.returncode}: {said[:200]!r}")
        return proc.stdout
