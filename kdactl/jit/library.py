"""Load the kernel library: the AOT bundle's entry if it verifies, else the JIT cache (built when
missing or bad), through ctypes with a declared signature for every C ABI entry point. A library
whose ABI version, route table or constants differ from kdactl.kernel_abi is refused at load time.

Nothing happens at import time; the loaded library is cached per process.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdactl.errors import BuildError, Inconclusive, NoGpu, ToolMissing
from kdactl.hw.toolkit import Toolkit, find_toolkit
from kdactl.jit import aot
from kdactl.jit.build import build_library, lookup_cached
from kdactl.jit.progress import BuildProgress
from kdactl.jit.resolver import TargetResolver
from kdactl.jit.spec import kernel_library_spec
from kdactl.kernel_abi import ABI_VERSION, ERR_WRONG_DEVICE, EXPECTED_CONSTANTS, ROUTES, KdaArgs
from kdactl.settings import Settings
from kdactl.targets import get_target

log = logging.getLogger("kdactl.jit")

ToolkitProvider = Callable[[str], Toolkit]

_KDA_ROUTE_SIGNATURE = ([ctypes.POINTER(KdaArgs), ctypes.c_void_p], ctypes.c_int)

# Every entry point of csrc/kdactl_api.h: (argtypes, restype), with the launcher kdactl_kda_<route> of
# every route. Any other exported kdactl_kda_<route> takes the KDA route signature (Kernels.kda_route).
SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "kdactl_abi_version": ([], ctypes.c_int),
    "kdactl_target_name": ([], ctypes.c_char_p),
    "kdactl_error_string": ([ctypes.c_int], ctypes.c_char_p),
    "kdactl_error_argument": ([ctypes.c_int], ctypes.c_char_p),
    "kdactl_constant": ([ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)], ctypes.c_int),
    "kdactl_route_count": ([], ctypes.c_int),
    "kdactl_route_name": ([ctypes.c_int], ctypes.c_char_p),
    "kdactl_check_device": ([], ctypes.c_int),
    "kdactl_selftest": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p], ctypes.c_int),
    "kdactl_stream_capture_id": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)], ctypes.c_int),
    "kdactl_kda_workspace_bytes": (
        [ctypes.POINTER(KdaArgs), ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)],
        ctypes.c_int,
    ),
    **{f"kdactl_kda_{route}": _KDA_ROUTE_SIGNATURE for route in ROUTES},
}


class KernelError(Inconclusive, RuntimeError):
    """A kernel entry point returned an error code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class KernelArgumentError(KernelError, ValueError):
    """An entry point rejected one of its arguments: ``argument`` is its name (kdactl_error_argument)."""

    def __init__(self, message: str, code: int, argument: str) -> None:
        super().__init__(message, code)
        self.argument = argument


@dataclass(frozen=True, eq=False)
class Kernels:
    lib: ctypes.CDLL = field(repr=False)
    path: Path
    target: str
    origin: str  # "aot", "cache" (found) or "built" (built just now)
    manifest: dict[str, Any] = field(repr=False)
    build_s: float = 0.0
    load_s: float = 0.0

    def error_string(self, rc: int) -> str:
        text = self.lib.kdactl_error_string(rc)
        return text.decode(errors="replace") if text else f"unknown error {rc}"

    def check(self, rc: int, what: str) -> None:
        """Raise on a non-zero return code: BuildError when the build cannot run on this device,
        KernelArgumentError (a ValueError) naming the argument a bad-argument code names."""
        if rc == 0:
            return
        message = f"{what} failed ({self.target}): {self.error_string(rc)} (code {rc})"
        if rc == ERR_WRONG_DEVICE:
            raise BuildError(message)
        argument = self.lib.kdactl_error_argument(rc)
        if argument:
            raise KernelArgumentError(message, rc, argument.decode(errors="replace"))
        raise KernelError(message, rc)

    def check_device(self) -> None:
        self.check(self.lib.kdactl_check_device(), "kdactl_check_device")

    def capture_id(self, stream: int) -> int:
        """The id of the CUDA graph capture under way on ``stream`` (0 when not capturing)."""
        out = ctypes.c_ulonglong(0)
        self.check(self.lib.kdactl_stream_capture_id(ctypes.c_void_p(stream), ctypes.byref(out)), "capture id")
        return out.value

    def workspace_bytes(self, route_id: int, args: KdaArgs) -> int:
        """Scratch bytes route ``route_id`` needs for the shapes in ``args`` (its pointers are not read)."""
        out = ctypes.c_uint64(0)
        rc = self.lib.kdactl_kda_workspace_bytes(ctypes.byref(args), route_id, ctypes.byref(out))
        self.check(rc, f"workspace size of route {ROUTES[route_id]!r}")
        return out.value

    def kda_route(self, route: str) -> Any:
        """The ctypes function for kdactl_kda_<route>; BuildError when the library lacks it."""
        name = f"kdactl_kda_{route}"
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise BuildError(f"{self.path} has no entry point {name}") from None
        fn.argtypes, fn.restype = _KDA_ROUTE_SIGNATURE
        return fn


@functools.cache
def _bind(path: str) -> ctypes.CDLL:
    """dlopen once per path and declare every signature."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        raise BuildError(f"cannot load {path}: {err}") from None
    missing = [name for name in SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise BuildError(f"{path} lacks entry points: {', '.join(missing)}")
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def open_library(path: Path, target: str) -> ctypes.CDLL:
    """Load and check that it is the ABI, target, route table and constants we expect."""
    lib = _bind(str(path))
    abi = lib.kdactl_abi_version()
    if abi != ABI_VERSION:
        raise BuildError(f"{path} has C ABI version {abi}, this kdactl needs {ABI_VERSION}")
    built_for = (lib.kdactl_target_name() or b"").decode(errors="replace")
    if built_for != target:
        raise BuildError(f"{path} was compiled for {built_for!r}, expected {target!r}")
    check_tables(lib, path)
    return lib


def check_tables(lib: Any, path: Path) -> None:
    """BuildError naming every difference between the library's route table and constants and
    kdactl.kernel_abi's: a route id names another kernel there, or a constant has another value."""
    theirs = {i: (lib.kdactl_route_name(i) or b"").decode(errors="replace") for i in range(lib.kdactl_route_count())}
    ours = dict(enumerate(ROUTES))
    problems = [f"route {i} is {_shown(theirs.get(i))} in the library, {_shown(ours.get(i))} in kdactl"
                for i in sorted(ours.keys() | theirs.keys()) if theirs.get(i) != ours.get(i)]  # fmt: skip
    for name, want in EXPECTED_CONSTANTS.items():
        value = ctypes.c_int64(0)
        if lib.kdactl_constant(name.encode(), ctypes.byref(value)) != 0:
            problems.append(f"KDACTL_{name} is missing in the library, {want} in kdactl")
        elif value.value != want:
            problems.append(f"KDACTL_{name} is {value.value} in the library, {want} in kdactl")
    if problems:
        raise BuildError(f"{path} does not match kdactl.kernel_abi: {'; '.join(problems)}")


def _shown(name: str | None) -> str:
    return "missing" if name is None else repr(name)


def open_kernels(
    settings: Settings,
    target_name: str | None = None,
    toolkit_provider: ToolkitProvider = find_toolkit,
    csrc: Path | None = None,
    progress: BuildProgress | None = None,
) -> Kernels:
    """Uncached load: AOT entry, else JIT cache entry, else build (its steps to ``progress``).
    Reports where it came from."""
    target = choose_target(settings, target_name, toolkit_provider)
    start = time.monotonic()
    spec = kernel_library_spec(get_target(target), csrc)
    entry = aot.find_entry(settings.aot_dir, spec) if settings.aot_dir else None
    if entry is not None:
        origin, directory, manifest, build_s = "aot", entry.directory, entry.manifest, 0.0
    else:
        result = lookup_cached(spec, settings.cache_dir)
        if result is None:
            toolkit = _toolkit_or_explain(settings, target, toolkit_provider)
            result = build_library(spec, settings.cache_dir, toolkit, progress=progress)
        origin = "built" if result.built else "cache"
        directory, manifest, build_s = result.directory, result.manifest, result.build_s
    path = directory / manifest["library"]
    load_start = time.monotonic()
    lib = open_library(path, target)
    load_s = time.monotonic() - load_start if origin == "built" else time.monotonic() - start
    return Kernels(lib, path, target, origin, manifest, build_s=build_s, load_s=load_s)


def load_kernels(
    settings: Settings,
    target_name: str | None = None,
    toolkit_provider: ToolkitProvider = find_toolkit,
    csrc: Path | None = None,
) -> Kernels:
    """The kernel library for ``target_name`` (default: KDACTL_CUDA_ARCH, else the current CUDA
    device's target), loaded once per process per settings and target."""
    key = (settings.cache_dir, settings.aot_dir, settings.nvcc, settings.cuda_arch, csrc)
    return _load_cached(key, target_name, toolkit_provider, _Carry(settings))


class _Carry:
    """Carries a value through lru_cache without making it part of the key."""

    def __init__(self, value: Settings) -> None:
        self.value = value

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Carry)


@functools.lru_cache(maxsize=16)
def _load_cached(key: tuple, target_name: str | None, provider: ToolkitProvider, settings: _Carry) -> Kernels:
    return open_kernels(settings.value, target_name, provider, key[-1])


def clear_loaded() -> None:
    """Forget the per-process cache (tests)."""
    _load_cached.cache_clear()


def choose_target(settings: Settings, target_name: str | None, toolkit_provider: ToolkitProvider) -> str:
    """Explicit name, else the resolver's target for the current device (KDACTL_CUDA_ARCH, else an
    AOT entry that runs on it, else the SPEC policy for this device and the local nvcc)."""
    if target_name:  # named: no device or toolkit to consult
        return get_target(target_name).name
    resolver = TargetResolver.from_settings(settings)
    return resolver.require(current_device_cc, lambda: _toolkit_or_explain(settings, None, toolkit_provider).version)


def current_device_cc() -> tuple[int, int]:
    import torch

    if not torch.cuda.is_available():
        raise NoGpu("no CUDA device visible to torch; name a target to compile only (kdactl build --target ...)")
    major, minor = torch.cuda.get_device_capability()
    return int(major), int(minor)


def _toolkit_or_explain(settings: Settings, target: str | None, provider: ToolkitProvider) -> Toolkit:
    try:
        return provider(settings.nvcc)
    except ToolMissing as err:
        where = (
            f"KDACTL_AOT_DIR={settings.aot_dir} has no usable entry"
            if settings.aot_dir
            else "KDACTL_AOT_DIR is not set"
        )
        what = f" for {target}" if target else ""
        raise ToolMissing(f"{err}; no prebuilt kernel library{what} either ({where})") from None
