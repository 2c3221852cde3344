"""Outside tools and optional modules a test needs. Locally a missing one skips the test; in CI
(CI=true, as .ci/run is run) it fails it: CI installs them, so a missing one is a broken CI."""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _missing(what: str) -> None:
    if in_ci():
        pytest.fail(f"{what} is missing in CI (CI=true): .ci/run must install it")
    pytest.skip(f"needs {what}")


def require_tool(name: str, how: str) -> str:
    """The path of program ``name``; ``how`` says how to get it (for the skip/fail message)."""
    path = shutil.which(name)
    if path is None:
        _missing(f"{name} ({how})")
    return path  # type: ignore[return-value]


def require_module(name: str, how: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        _missing(f"Python module {name} ({how}; {err})")
        raise  # unreachable: _missing skips or fails
