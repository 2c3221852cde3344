"""The positive-control library (csrc/faults/): build it through the one builder, and run a fault.

Nothing here imports torch: the control payload that runs a fault under compute-sanitizer is a bare
Python process with this library and ctypes, so it starts in well under a second.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from kdactl.errors import BuildError
from kdactl.hw.toolkit import find_toolkit
from kdactl.settings import Settings
from kdactl.targets import get_target

# fault name -> the compute-sanitizer tool that must report it
FAULTS: dict[str, str] = {"oob": "memcheck", "barrier": "synccheck", "race": "racecheck", "uninit": "initcheck"}
CONTROL_FOR_TOOL: dict[str, str] = {tool: fault for fault, tool in FAULTS.items()}


def build_faults(settings: Settings, target: str, csrc: Path | None = None) -> Path:
    """The path of libkdactl_faults.so for ``target``: from the cache, else built (needs nvcc)."""
    from kdactl.jit.build import build_library, lookup_cached
    from kdactl.jit.spec import faults_library_spec

    spec = faults_library_spec(get_target(target), csrc)
    found = lookup_cached(spec, settings.cache_dir)
    if found is None:
        found = build_library(spec, settings.cache_dir, find_toolkit(settings.nvcc))
    return found.library


def run_fault(library: Path | str, fault: str) -> tuple[int, bool]:
    """Run one planted fault on the current device: (return code, whether the launch was accepted)."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as err:
        raise BuildError(f"cannot load the positive-control library {library}: {err}") from None
    fn = lib.kdactl_fault_run
    fn.argtypes, fn.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)], ctypes.c_int
    launched = ctypes.c_int(0)
    rc = fn(fault.encode(), ctypes.byref(launched))
    return int(rc), bool(launched.value)
