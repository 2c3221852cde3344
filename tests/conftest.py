"""Shared pytest wiring: tests marked ``gpu`` skip cleanly where torch sees no CUDA device; tests
that compile with the real nvcc (the ``nvcc_toolkit`` fixture) carry the ``nvcc`` marker, which the
default run deselects (pyproject addopts) and CI runs on its own (``-m nvcc``)."""

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch or a broken driver: no GPU tests
        return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "nvcc_toolkit" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.nvcc)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- kernel library build/load (kdactl.jit) ----------------------------------------------------

TINY_KDA_STUB = """// Test stub: the tiny library has every ABI entry point and the real route table, but no KDA kernel.
#include "common.cuh"
#define KDACTL_STUB_ROUTE(id, name)                                                                 \\
  extern "C" int kdactl_kda_##name(const kdactl_kda_args*, void*) { return KDACTL_ERR_UNSUPPORTED; } \\
  uint64_t kdactl_##name##_workspace_bytes(const kdactl_kda_args&) { return 0; }
KDACTL_ROUTES(KDACTL_STUB_ROUTE)
"""


@pytest.fixture(scope="session")
def nvcc_toolkit():
    """The real nvcc (CI has it); tests that compile skip, visibly, where there is none."""
    from kdactl.errors import KdactlError
    from kdactl.hw.toolkit import find_toolkit

    try:
        return find_toolkit()
    except KdactlError as err:
        pytest.skip(f"needs nvcc: {err}")


def load_tool(name: str):
    """tools/<name>.py as a module, imported as running it as a script would: with tools/ on sys.path, for
    the tools that import their siblings (the probes share fused_probe's planning and build)."""
    import importlib.util
    import sys
    from pathlib import Path

    tools = str(Path(__file__).resolve().parents[1] / "tools")
    sys.path.insert(0, tools)
    try:
        spec = importlib.util.spec_from_file_location(name, f"{tools}/{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass looks its module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(tools)
    return module


def copy_tiny_csrc(folder):
    """A copy of csrc under ``folder`` with every header but only library.cu, selftest.cu and a KDA
    stub as sources: compiles in about two seconds, so builder tests stay fast however big the real
    kernels grow."""
    import shutil

    from kdactl.assets import csrc_dir

    src = csrc_dir()
    dest = folder / "csrc"
    dest.mkdir()
    headers = [p.name for p in src.iterdir() if p.suffix in (".cuh", ".h")]
    for name in ("library.cu", "selftest.cu", *headers):
        shutil.copy(src / name, dest / name)
    (dest / "kda_stub.cu").write_text(TINY_KDA_STUB)
    return dest


@pytest.fixture
def tiny_csrc(tmp_path):
    """copy_tiny_csrc in the test's own folder."""
    return copy_tiny_csrc(tmp_path)
