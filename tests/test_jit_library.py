"""kdactl.jit.library, kdactl.jit.aot and kdactl.jit.selftest: loading, AOT bundles, the self-test.

Loading needs no GPU (cudart is linked statically; only the self-test touches the device)."""

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kdactl.errors import EXIT_INCONCLUSIVE, BuildError, ToolMissing, UsageError
from kdactl.hw.toolkit import Toolkit, find_toolkit
from kdactl.jit import aot, library
from kdactl.build_command import compile_targets
from kdactl.jit.library import (EXPECTED_CONSTANTS, KdaArgs, KernelArgumentError, Kernels, KernelError, check_tables,
                                load_kernels, open_kernels, open_library)  # fmt: skip
from kdactl.jit.selftest import BLOCK, compare, expected_values, mix, run_selftest
from kdactl.kernel_abi import ROUTES
from kdactl.settings import Settings
from kdactl.targets import get_target


def _settings(tmp_path, **kw):
    return Settings(cache_dir=tmp_path / "cache", data_dir=tmp_path / "data", **kw)


def _no_nvcc(nvcc="nvcc"):
    raise ToolMissing(f"nvcc not found (looked for {nvcc!r} on PATH)")


# --- the ctypes mirror of the C ABI --------------------------------------------------------------

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _run_c(tmp_path, body: str, includes: str = "") -> str:
    src = tmp_path / "probe.c"
    src.write_text(f"#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n{includes}\nint main(void) {{\n{body}\nreturn 0; }}\n")
    exe = tmp_path / "probe"
    subprocess.run(["cc", "-O0", "-o", str(exe), str(src)], check=True, capture_output=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def test_kda_args_takes_data_ptr_ints():
    args = KdaArgs(q=0x7F0000001000, batch=2, scale=0.125, cu_seqlens=None)
    assert args.q == 0x7F0000001000 and args.cu_seqlens is None and args.batch == 2


# --- the load-time check of the route table and the shared constants -----------------------------


class _TableLib:
    """The table entry points of a library whose routes and constants the test chooses."""

    def __init__(self, routes=ROUTES, **constants):
        self.routes = [name.encode() for name in routes]
        self.constants = {**EXPECTED_CONSTANTS, **constants}

    def kdactl_route_count(self):
        return len(self.routes)

    def kdactl_route_name(self, i):
        return self.routes[i] if 0 <= i < len(self.routes) else None

    def kdactl_constant(self, name, out):
        value = self.constants.get(name.decode())
        if value is None:
            return 10103  # KDACTL_ERR_BAD_NAME
        out._obj.value = value
        return 0


def test_check_tables_accepts_the_library_of_this_registry():
    check_tables(_TableLib(), Path("/x/libkdactl.so"))


@pytest.mark.parametrize("routes, why", [
    (("direct", "chunk"), "route 2 is missing in the library, 'small_bh' in kdactl"),
    (("direct", "small_bh", "chunk"), "route 1 is 'small_bh' in the library, 'chunk' in kdactl; route 2 is 'chunk'"),
    ((*ROUTES, "segmented"), "route 3 is 'segmented' in the library, missing in kdactl"),
], ids=["one-missing", "two-swapped", "one-extra"])  # fmt: skip
def test_check_tables_names_each_route_that_differs(routes, why):
    with pytest.raises(BuildError, match=f"/x/libkdactl.so does not match kdactl.kernel_abi: {why}"):
        check_tables(_TableLib(routes), Path("/x/libkdactl.so"))


def test_check_tables_names_each_constant_that_differs():
    lib = _TableLib(MAX_GRID_DIM=1024, SMALL_BH_CTAS_PER_SM=None)
    with pytest.raises(BuildError) as err:
        check_tables(lib, Path("/x/libkdactl.so"))
    assert "KDACTL_MAX_GRID_DIM is 1024 in the library, 65535 in kdactl" in str(err.value)
    assert "KDACTL_SMALL_BH_CTAS_PER_SM is missing in the library, 2 in kdactl" in str(err.value)


# --- Kernels.check --------------------------------------------------------------------------------


class _FakeLib:
    def kdactl_error_string(self, rc):
        messages = {10001: b"device compute capability cannot run this build's target sm_90a",
                    10112: b"workspace is NULL or smaller than kdactl_kda_workspace_bytes"}  # fmt: skip
        return messages.get(rc, b"an illegal memory access was encountered")

    def kdactl_error_argument(self, rc):
        return {10112: b"workspace"}.get(rc)


def _fake_kernels():
    return Kernels(_FakeLib(), Path("/x/libkdactl.so"), "sm_90a", "cache", {})


def test_check_passes_zero():
    _fake_kernels().check(0, "kdactl_selftest")


def test_check_raises_kernel_error_with_the_library_message():
    with pytest.raises(KernelError, match=r"kdactl_kda_direct failed \(sm_90a\): an illegal memory access.*code 700") as err:
        _fake_kernels().check(700, "kdactl_kda_direct")
    assert isinstance(err.value, RuntimeError) and err.value.exit_code == EXIT_INCONCLUSIVE and err.value.code == 700


def test_check_wrong_device_is_a_build_error():
    with pytest.raises(BuildError, match="cannot run this build's target"):
        _fake_kernels().check(10001, "kdactl_selftest")


def test_check_raises_a_value_error_naming_a_rejected_argument():
    with pytest.raises(ValueError, match=r"route 'chunk' failed \(sm_90a\): workspace is NULL .*code 10112") as err:
        _fake_kernels().check(10112, "KDA prefill route 'chunk'")
    assert isinstance(err.value, KernelArgumentError) and isinstance(err.value, KernelError)
    assert err.value.argument == "workspace" and err.value.code == 10112
    with pytest.raises(KernelError) as err:
        _fake_kernels().check(700, "kdactl_kda_direct")
    assert not isinstance(err.value, ValueError)


# --- target choice --------------------------------------------------------------------------------


def test_choose_target_explicit_and_override(tmp_path):
    assert library.choose_target(_settings(tmp_path), "sm_100f", _no_nvcc) == "sm_100f"
    assert library.choose_target(_settings(tmp_path, cuda_arch="sm_120f"), None, _no_nvcc) == "sm_120f"
    with pytest.raises(UsageError, match="unknown kernel target 'sm_91'"):
        library.choose_target(_settings(tmp_path), "sm_91", _no_nvcc)


def test_choose_target_from_the_device_and_nvcc(tmp_path, monkeypatch):
    monkeypatch.setattr(library, "current_device_cc", lambda: (10, 3))
    tk = Toolkit("/x/nvcc", (13, 0), "")
    assert library.choose_target(_settings(tmp_path), None, lambda nvcc: tk) == "sm_100f"


def test_choose_target_from_the_aot_bundle_without_nvcc(tmp_path, monkeypatch):
    monkeypatch.setattr(library, "current_device_cc", lambda: (9, 0))
    bundle = tmp_path / "aot"
    bundle.mkdir()
    entries = {t: {"nvcc_version": "13.0"} for t in ("sm_90a", "sm_100f")}
    (bundle / "manifest.json").write_text(json.dumps({"schema": aot.AOT_SCHEMA, "entries": entries}))
    assert library.choose_target(_settings(tmp_path, aot_dir=bundle), None, _no_nvcc) == "sm_90a"


# --- loading (real nvcc, no GPU needed) -----------------------------------------------------------


def test_no_nvcc_and_no_aot_is_inconclusive_with_the_reason(tmp_path, tiny_csrc):
    with pytest.raises(ToolMissing, match="nvcc not found.*no prebuilt kernel library for sm_90a.*KDACTL_AOT_DIR is not set") as err:
        open_kernels(_settings(tmp_path), "sm_90a", _no_nvcc, tiny_csrc)
    assert err.value.exit_code == EXIT_INCONCLUSIVE


def test_load_builds_then_loads_from_cache(tmp_path, tiny_csrc, nvcc_toolkit):
    settings = _settings(tmp_path)
    first = open_kernels(settings, "sm_90a", lambda nvcc: nvcc_toolkit, tiny_csrc)
    assert first.origin == "built" and first.build_s > 0
    assert first.lib.kdactl_abi_version() == library.ABI_VERSION
    assert first.lib.kdactl_target_name() == b"sm_90a"
    again = open_kernels(settings, "sm_90a", _no_nvcc, tiny_csrc)  # the cache needs no nvcc
    assert again.origin == "cache" and again.path == first.path and again.load_s < 1.0
    with pytest.raises(BuildError, match="compiled for 'sm_90a', expected 'sm_100f'"):
        open_library(first.path, "sm_100f")
    assert first.error_string(10003) == "no kernel for this configuration in this build"
    with pytest.raises(BuildError, match="no entry point kdactl_kda_segmented"):
        first.kda_route("segmented")
    assert first.kda_route("direct").argtypes[0] is ctypes.POINTER(KdaArgs)


def test_the_real_library_exports_the_registry_and_names_bad_arguments(tmp_path, nvcc_toolkit):
    kernels = open_kernels(_settings(tmp_path), "sm_90a", lambda nvcc: nvcc_toolkit)  # all of csrc; the load checks
    lib = kernels.lib
    assert [lib.kdactl_route_name(i).decode() for i in range(lib.kdactl_route_count())] == list(ROUTES)
    for name, want in EXPECTED_CONSTANTS.items():
        value = ctypes.c_int64(0)
        assert lib.kdactl_constant(name.encode(), ctypes.byref(value)) == 0 and value.value == want, name
    # Shapes a launcher refuses before it asks for a device, so that they answer without a GPU too.
    with pytest.raises(KernelArgumentError, match=r"heads must be in 1\.\.65535") as err:
        kernels.check(kernels.kda_route("chunk")(ctypes.byref(KdaArgs(batch=1, heads=0)), None), "route 'chunk'")
    assert err.value.argument == "heads"
    no_tokens = KdaArgs(batch=0, heads=2, key_dim=128, value_dim=128, tuning_warps=4)  # route direct builds no shape
    with pytest.raises(KernelArgumentError, match="tuning_warps and tuning_stages name no kernel this route builds"):
        kernels.check(kernels.kda_route("direct")(ctypes.byref(no_tokens), None), "route 'direct'")
    shapes = KdaArgs(batch=1, seqlen=64, heads=2, key_dim=128, value_dim=128, segment_chunks=2)
    sizes = {name: kernels.workspace_bytes(i, shapes) for i, name in enumerate(ROUTES)}
    assert sizes["direct"] == 0 and sizes["small_bh"] > sizes["chunk"] > 0
    # The layout is the varlen field, never the pointer: two sequences packed into T = 64 need the
    # chunked route's scratch for 64 rows, two fixed ones for 128; the sizes read no pointer.
    fixed = KdaArgs(batch=2, seqlen=64, heads=2, key_dim=128, value_dim=128)
    packed = KdaArgs(batch=2, seqlen=64, heads=2, key_dim=128, value_dim=128, varlen=1)
    # The chunk route's scratch is its blocks alone: slots x heads x a block's bytes (csrc/kda_chunk.cuh
    # Block<128>, whole 128-byte lines with nothing of small_bh's in them).
    assert kernels.workspace_bytes(ROUTES.index("chunk"), fixed) == (2 * 64 // 16 + 2) * 2 * 14848
    # small_bh on varlen (3 sequences, 200 tokens): the blocks' bounds, a table of units besides the states.
    packed = KdaArgs(batch=3, seqlen=200, heads=2, key_dim=128, value_dim=128, segment_chunks=2, varlen=1)
    slots = 200 // 16 + 3
    units = -(-slots // 2) + 3  # ceil(slots / segment_chunks) + N
    blocks = slots * 2 * 14848 + 128  # and a 128-byte line of their bounds (slots x heads fp32)
    want = blocks + units * 2 * (128 * 128 * 2) * 4 + 3 * 2 * 128 * 128 * 4 + (units + 3 + 1) * 4 + 4  # + a pool's
    # starts, the table, and a word for whether every segment starts warm (kda_small_bh_all_warm)
    assert kernels.workspace_bytes(ROUTES.index("small_bh"), packed) == want
    # The size is computed before any pointer is set: a state pool's pointer must not change it.
    pooled = KdaArgs(batch=3, seqlen=200, heads=2, key_dim=128, value_dim=128, segment_chunks=2, varlen=1,
                     state_indices=0x1000)  # fmt: skip
    assert kernels.workspace_bytes(ROUTES.index("small_bh"), pooled) == want
    for bad in (dict(varlen=1), dict(cu_seqlens=0x1000), dict(varlen=2, cu_seqlens=0x1000)):  # a launch checks both
        with pytest.raises(KernelArgumentError, match="varlen must be 0 or 1, and cu_seqlens non-NULL exactly") as err:
            args = KdaArgs(batch=1, seqlen=64, heads=2, key_dim=128, value_dim=128, **bad)
            kernels.check(kernels.kda_route("direct")(ctypes.byref(args), None), "route 'direct'")
        assert err.value.argument == "varlen"
    out = ctypes.c_uint64(0)
    assert lib.kdactl_error_argument(lib.kdactl_kda_workspace_bytes(ctypes.byref(shapes), len(ROUTES), ctypes.byref(out))) == b"route"


def test_load_kernels_is_cached_per_process(tmp_path, tiny_csrc, nvcc_toolkit):
    settings = _settings(tmp_path)
    library.clear_loaded()
    provider = lambda nvcc: nvcc_toolkit  # noqa: E731
    try:
        a = load_kernels(settings, "sm_90a", provider, tiny_csrc)
        assert load_kernels(settings, "sm_90a", provider, tiny_csrc) is a
        assert a.origin == "built"
    finally:
        library.clear_loaded()


def test_aot_bundle_is_relocatable_and_loads_without_nvcc(tmp_path, tiny_csrc, nvcc_toolkit, caplog):
    report = compile_targets(_settings(tmp_path), [get_target("sm_90a")], tmp_path / "aot", lambda n: nvcc_toolkit, tiny_csrc)
    assert report.aot_manifest == tmp_path / "aot" / "manifest.json"
    index_text = report.aot_manifest.read_text()
    assert str(tmp_path) not in index_text and str(tmp_path) not in (tmp_path / "aot/sm_90a/manifest.json").read_text()
    moved = tmp_path / "elsewhere" / "bundle"
    shutil.move(str(tmp_path / "aot"), moved)
    node = Settings(cache_dir=tmp_path / "node-cache", data_dir=tmp_path / "d", aot_dir=moved)
    kernels = open_kernels(node, "sm_90a", _no_nvcc, tiny_csrc)
    assert kernels.origin == "aot" and kernels.path == moved / "sm_90a" / "libkdactl.so"
    assert not (tmp_path / "node-cache").exists() or not any((tmp_path / "node-cache").rglob("*.so"))
    # a damaged entry is ignored with a warning; without nvcc that is inconclusive, with the reason
    so = moved / "sm_90a" / "libkdactl.so"
    so.unlink()  # a new inode: the copy this process has mapped stays intact
    so.write_bytes(b"damaged")
    with pytest.raises(ToolMissing, match="has no usable entry"):
        open_kernels(node, "sm_90a", _no_nvcc, tiny_csrc)
    assert "ignoring AOT entry" in caplog.text and "sha256" in caplog.text


def test_aot_entry_from_other_sources_falls_back_to_the_cache(tmp_path, tiny_csrc, nvcc_toolkit, caplog):
    settings = _settings(tmp_path, aot_dir=tmp_path / "aot")
    compile_targets(settings, [get_target("sm_90a")], tmp_path / "aot", lambda n: nvcc_toolkit, tiny_csrc)
    with open(tiny_csrc / "common.cuh", "a") as f:
        f.write("\n// changed after the bundle was made\n")
    kernels = open_kernels(settings, "sm_90a", lambda n: nvcc_toolkit, tiny_csrc)
    assert kernels.origin == "built"
    assert "source hash does not match" in caplog.text


def test_group_writable_aot_dir_is_refused(tmp_path, tiny_csrc, nvcc_toolkit):
    from kdactl.errors import UnsafeCache

    settings = _settings(tmp_path, aot_dir=tmp_path / "aot")
    compile_targets(settings, [get_target("sm_90a")], tmp_path / "aot", lambda n: nvcc_toolkit, tiny_csrc)
    os.chmod(tmp_path / "aot", 0o777)
    with pytest.raises(UnsafeCache, match="writable by group or other"):
        open_kernels(settings, "sm_90a", _no_nvcc, tiny_csrc)


# --- the self-test's expected values (pure) -------------------------------------------------------


def _simulate_kernel(n, seed):
    """selftest.cu thread by thread: a butterfly of xor-shuffles per warp, a shared tile per block."""
    out = {}
    for block in range(-(-n // BLOCK)):
        x = [mix((block * BLOCK + t) ^ seed) for t in range(BLOCK)]
        sums = list(x)
        for off in (16, 8, 4, 2, 1):
            sums = [(sums[t] + sums[(t & ~31) | ((t & 31) ^ off)]) & 0xFFFFFFFF for t in range(BLOCK)]
        for t in range(BLOCK):
            i = block * BLOCK + t
            if i < n:
                out[i] = (x[t] + 3 * sums[t] + (x[(t + 1) % BLOCK] ^ 0x9E3779B9)) & 0xFFFFFFFF
    return [out[i] for i in range(n)]


@pytest.mark.parametrize("n, seed", [(1, 0), (31, 7), (256, 0x5EED1234), (300, 0xFFFFFFFF), (1000, 1)])
def test_expected_values_match_a_thread_by_thread_simulation(n, seed):
    assert expected_values(n, seed) == _simulate_kernel(n, seed)


def test_expected_values_by_hand():
    # seed 0, n 1: thread 0 sees x0 = mix(0) = 0; its warp sums mix(0..31); its neighbour is mix(1).
    warp = sum(mix(j) for j in range(32)) & 0xFFFFFFFF
    assert mix(0) == 0
    assert expected_values(1, 0) == [(0 + 3 * warp + (mix(1) ^ 0x9E3779B9)) & 0xFFFFFFFF]
    assert expected_values(0, 0) == []


@needs_cc
def test_mix_matches_native_uint32_arithmetic(tmp_path):
    body = """
    for (uint32_t i = 0; i < 8; ++i) {
      uint32_t x = i * 2654435761u;
      x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
      printf("%u\\n", x);
    }"""
    native = [int(v) for v in _run_c(tmp_path, body).split()]
    assert [mix((i * 2654435761) & 0xFFFFFFFF) for i in range(8)] == native


def test_compare_counts_mismatches_and_reports_the_first():
    assert compare([1, 2, 3], [1, 2, 3]) == (0, None)
    assert compare([1, -1, 3], [1, 2, 3]) == (1, {"index": 1, "expected": 2, "actual": 0xFFFFFFFF})
    assert compare([1], [1, 2])[0] == 1


# --- on a GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_selftest_passes_on_this_gpu(tmp_path, tiny_csrc):
    kernels = open_kernels(_settings(tmp_path), None, find_toolkit, tiny_csrc)
    kernels.check_device()
    result = run_selftest(kernels, device=0)
    assert result.passed, result.first_mismatch
    assert result.n == 50_001 and result.duration_s > 0


@pytest.mark.gpu
def test_selftest_of_the_real_library_on_this_gpu(tmp_path):
    kernels = load_kernels(_settings(tmp_path))
    assert run_selftest(kernels, device=0, n=1000, seed=3).passed
