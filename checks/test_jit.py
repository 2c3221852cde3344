"""JIT contracts: the kernel library is the right target for this node, loads, matches its
manifest, holds device code for this GPU's architecture, and passes the device self-test."""

from __future__ import annotations

import pytest
import torch

from kdactl.jit import devcode
from kdactl.jit.cache import sha256_file
from kdactl.jit.resolver import TargetResolver
from kdactl.jit.spec import kernel_library_spec
from kdactl.targets import get_target, target_runs_on

pytestmark = [pytest.mark.gpu, pytest.mark.quick]


def _cc(device) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def test_target_matches_policy(kernels, settings, device):
    cc = _cc(device)
    assert target_runs_on(kernels.target, cc), f"library target {kernels.target} does not run on cc {cc[0]}.{cc[1]}"
    from kdactl.hw.toolkit import find_toolkit

    expected = TargetResolver.from_settings(settings).require(lambda: cc, lambda: find_toolkit(settings.nvcc).version)
    assert kernels.target == expected, (
        f"library target {kernels.target}, expected {expected} for cc {cc[0]}.{cc[1]} (kdactl.jit.resolver)"
    )


def test_library_loads_for_this_device(kernels):
    kernels.check_device()  # raises with the reason when this build cannot run on this GPU
    built_for = kernels.lib.kdactl_target_name().decode()
    assert built_for == kernels.target, f"library reports target {built_for!r}, expected {kernels.target!r}"


def test_manifest_matches(kernels):
    manifest = kernels.manifest
    expected_hash = kernel_library_spec(get_target(kernels.target)).source_hash()
    assert manifest.get("source_hash") == expected_hash, (
        f"manifest source hash {str(manifest.get('source_hash'))[:16]}..., expected {expected_hash[:16]}... "
        "(the library was built from other sources or flags)"
    )
    recorded = manifest.get("files", {}).get(kernels.path.name)
    actual = sha256_file(kernels.path)
    assert recorded == actual, f"{kernels.path} sha256 {actual[:16]}..., manifest says {str(recorded)[:16]}..."


@pytest.fixture(scope="module")
def device_code(kernels, settings):
    """(how it was read, what was found): arch names from cuobjdump, else SM numbers from the
    embedded ELF images. No evidence at all is an error here, never a pass."""
    tool = devcode.find_cuobjdump(settings.nvcc)
    if tool:
        return "cuobjdump", devcode.list_elf(kernels.path, tool)
    sms = devcode.embedded_sms(kernels.path.read_bytes())
    if not sms:
        raise RuntimeError(f"no cuobjdump and no uncompressed CUDA ELF in {kernels.path}: cannot read its device code")
    return "elf", sms


def test_binary_holds_code_for_this_arch(device_code, kernels, device):
    how, found = device_code
    if how == "cuobjdump":
        assert kernels.target in found, f"cuobjdump lists {sorted(found)} in {kernels.path}, expected {kernels.target}"
    else:
        want = get_target(kernels.target).arch
        assert want in found, f"embedded CUDA ELF images are for SM {sorted(found)}, expected SM {want}"
    assert target_runs_on(kernels.target, _cc(device)), f"{kernels.target} code cannot run on cc {_cc(device)}"


def test_device_selftest(kernels, device):
    from kdactl.jit.selftest import run_selftest

    result = run_selftest(kernels, device.index)
    assert result.passed, f"self-test: {result.mismatches} of {result.n} values wrong, first {result.first_mismatch}"
