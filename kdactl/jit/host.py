"""Load kdactl_host, the eager prefill's planned path in C++ (csrc/host/kdactl_host.cpp): from the
JIT cache, built there when missing, by the one builder; imported as a Python extension module.

Nothing happens at import time. A node that cannot build it (no Python headers, say), or whose
module does not match kdactl.kernel_abi, still serves: kdactl.kda.plans then keeps its plans in
Python, and ``host_status`` says why.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from kdactl.errors import BuildError
from kdactl.hw.toolkit import find_toolkit
from kdactl.jit.build import BuildResult, build_library, lookup_cached
from kdactl.jit.spec import HOST_NAME, host_module_spec
from kdactl.kernel_abi import CALL_FIELDS, HOST_CONSTANTS
from kdactl.settings import Settings
from kdactl.targets import get_target

DISABLE_ENV = "KDACTL_HOST_MODULE"  # "0": keep the plans in Python (comparisons, and a way out)


def load_host_module(settings: Settings, target: str) -> tuple[ModuleType, BuildResult]:
    """(module, its cache entry), its call fields and constants checked against kdactl.kernel_abi;
    BuildError when it cannot be built or does not match."""
    spec = host_module_spec(get_target(target))
    result = lookup_cached(spec, settings.cache_dir)
    if result is None:
        result = build_library(spec, settings.cache_dir, find_toolkit(settings.nvcc))
    found = importlib.util.spec_from_file_location(HOST_NAME, result.library)
    if found is None or found.loader is None:
        raise BuildError(f"cannot import {result.library}")
    module = importlib.util.module_from_spec(found)
    try:
        found.loader.exec_module(module)
    except ImportError as err:
        raise BuildError(f"cannot import {result.library}: {err}") from None
    try:
        module.check_abi(CALL_FIELDS, HOST_CONSTANTS)
    except ValueError as err:
        raise BuildError(f"{result.library}: {err}") from None
    return module, result


def disabled(settings: Settings) -> bool:
    return settings.env.get(DISABLE_ENV, "").strip().lower() in ("0", "off", "no", "false")
