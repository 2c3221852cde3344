"""The NVML adapter (nvidia-ml-py's ``pynvml``): every call wrapped, vendor errors turned into ours.

``pynvml`` is imported when a reading is taken, never at import time. Tests pass a fake module
with the same functions (tests/fakes.py ``FakeNvml``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kdactl.errors import Inconclusive, NoGpu
from kdactl.hw.driver import DriverGpu, DriverInfo, on_off
from kdactl.hw.health import read_health, read_kernel_log


class NvmlUnavailable(NoGpu):
    """NVML itself cannot be loaded (no library, no driver): the nvidia-smi fallback may still answer."""


# NVML error codes (pynvml.NVML_ERROR_*) that mean "there is no driver to talk to".
_NO_DRIVER = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")
# Codes that mean "this GPU has no such feature": the fact is reported as None, not as an error.
_ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as err:
        raise NvmlUnavailable(f"NVML unavailable: cannot import pynvml (nvidia-ml-py): {err}") from None
    return pynvml


class PynvmlDriver:
    """DriverProvider over NVML. ``lib`` is the pynvml module (or a fake with its names)."""

    def __init__(self, lib: Any = None, kernel_log: Callable[[], str] | None = None) -> None:
        self._lib = lib
        self._kernel_log = kernel_log

    def read(self) -> DriverInfo:
        lib = self._lib if self._lib is not None else _load_pynvml()
        call = _Caller(lib)
        call.init()
        try:
            driver = _text(call("nvmlSystemGetDriverVersion"))
            count = call("nvmlDeviceGetCount")
            log = _once(self._kernel_log or read_kernel_log)
            gpus = tuple(_read_gpu(call, i, log) for i in range(count))
            cuda = _cuda_driver(call)
        finally:
            call.shutdown()
        return DriverInfo(source="nvml", driver_version=driver, cuda_driver=cuda, gpus=gpus)


class _Caller:
    """Calls pynvml functions by name; NVMLError becomes NvmlUnavailable, Inconclusive or None."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.error_type = getattr(lib, "NVMLError", Exception)

    def _code(self, name: str) -> object:
        return getattr(self.lib, name, object())

    def init(self) -> None:
        try:
            self.lib.nvmlInit()
        except self.error_type as err:
            if getattr(err, "value", None) in {self._code(n) for n in _NO_DRIVER}:
                raise NvmlUnavailable(f"no NVIDIA driver: NVML init failed: {err}") from None
            raise Inconclusive(f"NVML init failed: {err}") from None
        except OSError as err:  # a broken libnvidia-ml.so
            raise NvmlUnavailable(f"no NVIDIA driver: cannot load NVML: {err}") from None

    def shutdown(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except self.error_type:
            pass  # the reading is complete; a failing shutdown changes nothing about the node

    def __call__(self, fn: str, *args: Any, gpu: int | None = None, optional: bool = False) -> Any:
        func = getattr(self.lib, fn, None)
        if func is None:  # an nvidia-ml-py older than the function
            if optional:
                return None
            raise Inconclusive(f"NVML has no {fn}: nvidia-ml-py is too old")
        try:
            return func(*args)
        except self.error_type as err:
            if optional and getattr(err, "value", None) in {self._code(n) for n in _ABSENT}:
                return None
            where = "" if gpu is None else f" for GPU {gpu}"
            raise Inconclusive(f"NVML {fn}{where} failed: {err}") from None


def _once(read: Callable[[], str]) -> Callable[[], str]:
    """The kernel log read at most once per reading of the node (every GPU's XIDs come from it)."""
    memo: list[str] = []

    def get() -> str:
        if not memo:
            memo.append(read())
        return memo[0]

    return get


def _read_gpu(call: Callable[..., Any], index: int, kernel_log: Callable[[], str]) -> DriverGpu:
    h = call("nvmlDeviceGetHandleByIndex", index, gpu=index)
    major, minor = call("nvmlDeviceGetCudaComputeCapability", h, gpu=index)
    mig = call("nvmlDeviceGetMigMode", h, gpu=index, optional=True)
    ecc = call("nvmlDeviceGetEccMode", h, gpu=index, optional=True)
    return DriverGpu(
        index=index,
        uuid=_text(call("nvmlDeviceGetUUID", h, gpu=index)),
        name=_text(call("nvmlDeviceGetName", h, gpu=index)),
        memory_mib=int(call("nvmlDeviceGetMemoryInfo", h, gpu=index).total) // (1 << 20),
        cc=(int(major), int(minor)),
        mig=on_off(mig[0]) if mig else None,  # [current, pending]
        ecc=on_off(ecc[0]) if ecc else None,  # [current, pending]
        health=read_health(call, h, index, kernel_log),
    )


def _cuda_driver(call: Callable[..., Any]) -> tuple[int, int] | None:
    """nvmlSystemGetCudaDriverVersion(_v2): 13000 -> (13, 0); None where the driver cannot say."""
    raw = call("nvmlSystemGetCudaDriverVersion_v2", optional=True)
    if raw is None:
        raw = call("nvmlSystemGetCudaDriverVersion", optional=True)
    if raw is None:
        return None
    return int(raw) // 1000, (int(raw) % 1000) // 10


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
