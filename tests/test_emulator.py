"""The CPU emulator itself (tests/emu): how it rewrites csrc, and that it reports the faults the GPU
would and computes tensor-core products as a plain matrix product does (tests/emu/controls.cu).
Whether it runs the real kernels as the GPU does is tests/test_emulated_kernels.py's question: the
kernels the H200 passed must pass there too."""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from tests.emu.build import EMU_DIR, build, cuda_includes, emulated_source


def test_launches_and_shared_memory_are_rewritten():
    src = """
    kernel<<<grid, WARPS * 32, smem, stream>>>(a, ws);
    kda_keep<K, V><<<dim3(static_cast<unsigned>(a.batch), a.heads), 256, 0, stream>>>(a, sg);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ int64_t len[8];
    """
    out = emulated_source(src)
    assert "::emu::launch(kernel, grid, WARPS * 32, smem, stream)(a, ws);" in out
    assert "::emu::launch(kda_keep<K, V>, dim3(static_cast<unsigned>(a.batch), a.heads), 256, 0, stream)(a, sg);" in out
    assert "unsigned char* smem_raw = static_cast<unsigned char*>(::emu::dynamic_smem());" in out
    assert "static int64_t len[8];" in out
    assert "<<<" not in out and "__shared__" not in out


@pytest.fixture(scope="module")
def controls(tiny_csrc, nvcc_toolkit, tmp_path_factory):
    shutil.copy(EMU_DIR / "controls.cu", tiny_csrc / "emu_controls.cu")
    lib = build(tiny_csrc, cuda_includes(nvcc_toolkit.nvcc), tmp_path_factory.mktemp("emu-controls"))
    return ctypes.CDLL(str(lib))


@pytest.fixture(scope="module")
def tiny_csrc(tmp_path_factory):
    """conftest's tiny csrc, once for the module's controls."""
    from tests.conftest import copy_tiny_csrc

    return copy_tiny_csrc(tmp_path_factory.mktemp("tiny"))


LAUNCH_FAILURE, INVALID_VALUE = 719, 1  # cudaErrorLaunchFailure, cudaErrorInvalidValue


def test_deadlock_is_a_launch_failure(controls, capfd):
    assert controls.emu_control_deadlock() == LAUNCH_FAILURE
    assert "deadlock in kernel" in capfd.readouterr().err


def test_threads_that_exit_are_expected_at_no_barrier(controls):
    out = torch.zeros(64)
    assert controls.emu_control_early_exit(ctypes.c_void_p(out.data_ptr())) == 0
    assert out.tolist() == [1.0] * 32 + [2.0] * 32


@pytest.mark.parametrize(
    ("control", "value", "failure"),
    [
        ("emu_control_arrive", 4.0, "deadlock in kernel"),  # a bar.arrive completes the bar.sync warp 1 waits at
        ("emu_control_poll", 5.0, "polling a flag that no running thread sets"),  # warp 1 polls a flag
    ],
)
def test_a_hand_over_between_warps(controls, capfd, control, value, failure):
    """Warp 0 hands a value to warp 1; without the hand-over (the entry's second argument 0) warp 1 waits
    for ever, which is the launch's failure."""
    out = torch.zeros(32)
    assert getattr(controls, control)(ctypes.c_void_p(out.data_ptr()), 1) == 0
    assert out.tolist() == [value] * 32
    assert getattr(controls, control)(ctypes.c_void_p(out.data_ptr()), 0) == LAUNCH_FAILURE
    assert failure in capfd.readouterr().err


def test_misaligned_cp_async_is_a_launch_failure(controls, capfd):
    src = torch.zeros(16)
    assert controls.emu_control_misaligned_cp_async(ctypes.c_void_p(src.data_ptr())) == LAUNCH_FAILURE
    assert "not 16-byte aligned" in capfd.readouterr().err


def test_a_cp_async_lands_at_its_wait(controls):
    src, out = torch.full((4,), 7.0), torch.zeros(2)
    assert controls.emu_control_cp_async_order(ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(out.data_ptr())) == 0
    assert out.tolist() == [-1.0, 7.0]  # a read before the wait sees what was there


def test_guards_show_a_write_past_a_buffer(controls):
    """tests/emu/kernels.py puts every buffer of a call between guards; a write one past the end shows."""
    from tests.emu.kernels import Guards

    guards = Guards()
    out = guards.put("out", torch.zeros(8))
    assert controls.emu_control_write_at(ctypes.c_void_p(out.data_ptr()), 7) == 0
    assert guards.broken() == [] and out[7] == 1.0
    assert controls.emu_control_write_at(ctypes.c_void_p(out.data_ptr()), 8) == 0
    assert guards.broken() == ["out"]


def test_trap_is_a_launch_failure(controls, capfd):
    assert controls.emu_control_trap() == LAUNCH_FAILURE
    assert "__trap() in kernel" in capfd.readouterr().err


def test_lanes_at_different_collectives_fail(controls, capfd):
    out = torch.zeros(32)
    assert controls.emu_control_divergent(ctypes.c_void_p(out.data_ptr())) == LAUNCH_FAILURE
    assert "different collectives" in capfd.readouterr().err


def test_shared_memory_over_48_kb_needs_the_attribute(controls):
    assert controls.emu_control_too_much_smem() == INVALID_VALUE
    assert controls.emu_control_deadlock() == LAUNCH_FAILURE  # the error was read: the next launch runs


def test_ldmatrix_and_mma_make_the_matrix_product(controls):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    b = torch.randn(16, 8, generator=gen).to(torch.bfloat16)
    d = torch.full((16, 8), float("nan"))
    assert controls.emu_control_mma(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                                    ctypes.c_void_p(d.data_ptr())) == 0  # fmt: skip
    torch.testing.assert_close(d, a.float() @ b.float(), rtol=1e-6, atol=1e-5)


def test_wgmma_makes_the_matrix_product_at_its_wait(controls):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(64, 16, generator=gen).to(torch.bfloat16)
    b = torch.randn(16, 16, generator=gen).to(torch.bfloat16)
    before, after = torch.full((64, 16), float("nan")), torch.full((64, 16), float("nan"))
    ptrs = (ctypes.c_void_p(x.data_ptr()) for x in (a, b, before, after))
    assert controls.emu_control_wgmma(*ptrs) == 0
    assert torch.equal(before, torch.zeros(64, 16))  # not yet performed: D as it was
    torch.testing.assert_close(after, a.float() @ b.float(), rtol=1e-6, atol=1e-5)
