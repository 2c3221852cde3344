"""tools/fused_probe.py, the fused single-pass measurement: its segment plan and scope on the CPU, and
(nvcc tier) that tools/fused_probe.cu still compiles against the kernel headers, in every variant."""

import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import load_tool

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fused_probe.py"


@pytest.fixture(scope="module")
def probe():
    return load_tool("fused_probe")


@pytest.mark.parametrize(
    ("batch", "heads", "seqlen", "segment_chunks", "ctas"),
    [
        (1, 8, 65536, 256, 128),  # 16 segments of 256 chunks
        (1, 12, 32768, 187, 132),  # 11 segments, the last one shorter
        (1, 1, 1048576, 497, 132),
        (2, 64, 16384, 1024, 128),  # a sequence a segment: no warm start needed
        (1, 96, 8192, 512, 96),  # more heads than SMs: still one segment, one wave short of full
        (1, 12, 100, 1, 84),  # 7 chunks, fewer than the 11 segments the SMs would take: a chunk each
    ],
)
def test_segments_fill_the_sms_once(probe, batch, heads, seqlen, segment_chunks, ctas):
    seg = probe.probe_segment_chunks(batch, heads, seqlen, sms=132)
    assert seg == segment_chunks
    chunks = -(-seqlen // 16)
    assert batch * heads * -(-chunks // seg) == ctas
    assert batch * heads * -(-chunks // seg) <= max(132, batch * heads)


def _inputs(**change):
    x = {"q": torch.zeros(1, 32, 2, 128, dtype=torch.bfloat16), "v": torch.zeros(1, 32, 2, 128, dtype=torch.bfloat16),
         "g": torch.zeros(1, 32, 2, 128, dtype=torch.bfloat16), "cu_seqlens": None}  # fmt: skip
    x.update(change)
    return x


def test_scope_is_said_by_name(probe):
    assert probe.unsupported(_inputs()) is None
    assert "fixed-length" in probe.unsupported(_inputs(cu_seqlens=torch.tensor([0, 32])))
    assert "K = V = 128" in probe.unsupported(_inputs(q=torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)))
    assert "bf16" in probe.unsupported(_inputs(g=torch.zeros(1, 32, 2, 128)))
    assert "bf16" in probe.unsupported(_inputs(q=torch.zeros(1, 32, 2, 128, dtype=torch.float16)))


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "defines",
    [
        (),
        ("PROBE_PREFETCH",),
        ("PROBE_TRACE",),
        ("PROBE_SAME_INPUTS", "PROBE_NO_WALK", "PROBE_TRACE"),
        ("PROBE_PREP_WARPS=2",),
    ],
)
def test_the_probe_compiles_for_sm90a(probe, tmp_path, defines):
    so = tmp_path / "probe.so"
    done = subprocess.run(probe.compile_command(so, defines), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert so.stat().st_size > 0
    assert "kda_fused_probe" in done.stderr  # ptxas compiled the kernel itself, not only the host side


@pytest.fixture(scope="module")
def emulated(nvcc_toolkit, tmp_path_factory):
    """The emulated kernel library (tests/emu) with the probe built in."""
    from kdactl.assets import csrc_dir
    from tests.emu.build import build, cuda_includes

    return build(csrc_dir(), cuda_includes(nvcc_toolkit.nvcc), tmp_path_factory.mktemp("emu"),
                 extra=(TOOL.with_name("fused_probe.cu"),))  # fmt: skip


def _lower_bound_call(draw):
    from kdactl.bench import configs
    from tests.kda_inputs import raw_inputs

    x, A_log, dt_bias = raw_inputs(300, 2, draw)  # 19 chunks: 4 segments of 5, the last one of 4
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    options = dict(fused=configs.LOWER_BOUND.fused_spec(), A_log=A_log, dt_bias=dt_bias, state_v_first=True,
                   segment_chunks=5)  # fmt: skip
    return x, args, options


@pytest.mark.nvcc
def test_the_probe_gives_small_bh_bits_in_every_thread_order(emulated):
    """The probe's hand-over (named barriers, bar.arrive on one side) is race-free where the emulator
    can tell: its o and final state are small_bh's at the same segments, bit for bit, whichever order
    the threads released by each barrier run in; and within the SPEC's limit of the fp64 reference."""
    from kdactl.reference import ERROR_LIMIT, error_ratio, fused_inputs, kda_recurrent
    from tests.emu.kernels import EVERY_ORDER, FORWARD, EmulatedKernels

    x, args, options = _lower_bound_call("flashkda")
    o_ref, s_ref = EmulatedKernels(emulated, 132, FORWARD).run("small_bh", *args, **options)
    for schedule in EVERY_ORDER:
        kernels = EmulatedKernels(emulated, 132, schedule)
        o, s = kernels.run("small_bh", *args, entry="kdactl_fused_probe", workspace_byte=0, **options)
        assert not kernels.workspace[:4].any(), "a segment did not start warm"
        assert torch.equal(o, o_ref) and torch.equal(s, s_ref), f"schedule {schedule}"
    q, k, g, beta = fused_inputs(*args[:2], args[2], *args[3:], options["fused"], options["A_log"], options["dt_bias"])
    ref_o, ref_s = kda_recurrent(q, k, x["v"], g, beta)
    assert error_ratio(ref_o, o) < ERROR_LIMIT and error_ratio(ref_s, s.transpose(-1, -2)) < ERROR_LIMIT


@pytest.mark.nvcc
def test_a_segment_that_does_not_start_warm_is_refused(emulated):
    """A model at initialization barely decays: no segment start forgets its history within 4 chunks,
    and the probe says so in its flag instead of starting from a guess."""
    from tests.emu.kernels import EmulatedKernels

    _, args, options = _lower_bound_call("init")
    kernels = EmulatedKernels(emulated, 132)
    kernels.run("small_bh", *args, entry="kdactl_fused_probe", workspace_byte=0, **options)
    assert kernels.workspace[:4].any()
