"""tools/overlap_probe.py, the measurement of small_bh's walk beside prepare CTAs: its arithmetic over the
profiler's launches on the CPU, and (nvcc tier) that tools/overlap_probe.cu compiles for sm_90a and that its
two launchers, run apart on the emulator, are the route's passes: the prepare's blocks walked by the probe's
kReduce give small_bh's o and final state bit for bit."""

import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import load_tool

TOOLS = Path(__file__).resolve().parents[1] / "tools"
H100_SMEM_PER_SM = 233472  # 228 KB (sm_90)


@pytest.fixture(scope="module")
def probe():
    return load_tool("overlap_probe")


def test_the_padded_prepare_lets_exactly_the_asked_ctas_share_an_sm(probe):
    for ctas in (1, 2, 4, 6):
        smem = probe.capped_smem(H100_SMEM_PER_SM, ctas)
        assert ctas * (smem + 1024) <= H100_SMEM_PER_SM < (ctas + 1) * (smem + 1024)


@pytest.mark.parametrize(("seqlen", "fraction", "cut"), [(32768, 1.0, 32768), (32768, 0.5, 16384),
                                                         (1000, 0.25, 240), (100, 0.01, 16)])  # fmt: skip
def test_the_cut_is_whole_chunks(probe, seqlen, fraction, cut):
    assert probe.cut_seqlen(seqlen, fraction) == cut


def _launch(probe, name, start, end):
    return probe.Launch(f"void kdactl::chunk::{name}<128, ...>(kdactl_kda_args, ...)", start, end)


def test_beside_pairs_each_walk_with_its_prepare(probe):
    # two iterations, the profiler's order shuffled: walk 100 us, prepare 150 us starting 5 us after it
    launches = [_launch(probe, probe.PREPARE, 1005, 1155), _launch(probe, probe.WALK, 0, 100),
                _launch(probe, probe.WALK, 1000, 1100), _launch(probe, probe.PREPARE, 5, 155)]  # fmt: skip
    (w0, p0), (w1, p1) = probe.pairs(launches)
    assert (w0.start, p0.start, w1.start, p1.start) == (0, 5, 1000, 1005)
    assert probe.overlap(w0, p0) == 95 and probe.overlap(p0, w0) == 95
    line = probe.beside(launches, chunks=3000)
    assert line.startswith("walk 100.0 us, prepare 150.0 us (20.0 chunks/us), overlap 95.0 us, span 155.0 us")
    assert line.endswith("prepare started +5.0 us after the walk")


def test_launches_that_do_not_overlap_overlap_by_nothing(probe):
    assert probe.overlap(_launch(probe, probe.WALK, 0, 10), _launch(probe, probe.PREPARE, 20, 30)) == 0


def test_an_unpaired_launch_is_an_error_not_a_figure(probe):
    with pytest.raises(ValueError, match="2 walks but 1 prepares"):
        probe.pairs([_launch(probe, probe.WALK, 0, 1), _launch(probe, probe.WALK, 5, 6),
                     _launch(probe, probe.PREPARE, 0, 2)])  # fmt: skip
    with pytest.raises(ValueError, match="no kda_chunk_prepare launch"):
        probe.alone([_launch(probe, probe.WALK, 0, 1)], probe.PREPARE)
    assert probe.alone([_launch(probe, probe.WALK, 0, 4), _launch(probe, probe.WALK, 9, 10),
                        _launch(probe, probe.WALK, 20, 22)], probe.WALK) == "2.0 us"  # fmt: skip


@pytest.mark.nvcc
def test_the_probe_compiles_for_sm90a(probe, tmp_path):
    so = tmp_path / "probe.so"
    done = subprocess.run(probe.compile_command(so, source=probe.SOURCE), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert so.stat().st_size > 0
    for kernel in (probe.WALK, probe.PREPARE):  # ptxas compiled each kernel, not only the host side
        assert f"{kernel}ILi128E" in done.stderr


@pytest.fixture(scope="module")
def emulated(nvcc_toolkit, tmp_path_factory):
    """The emulated kernel library (tests/emu) with the probe built in."""
    from kdactl.assets import csrc_dir
    from tests.emu.build import build, cuda_includes

    return build(csrc_dir(), cuda_includes(nvcc_toolkit.nvcc), tmp_path_factory.mktemp("emu"),
                 extra=(TOOLS / "overlap_probe.cu",))  # fmt: skip


@pytest.mark.nvcc
def test_the_passes_apart_give_small_bhs_bits(emulated):
    """The route whole fills workspace A (and decides that every segment starts warm); the probe's prepare
    fills a workspace of NaN bytes, B, with A's blocks and bounds bit for bit; with A's answer copied into B,
    the probe's kReduce on B gives the route's o and final state bit for bit (it read nothing else of B), and
    with the answer "not all warm" it writes nothing, as the route's kReduce does."""
    import ctypes

    from kdactl.bench import configs
    from tests.emu.kernels import EmulatedKernels
    from tests.kda_inputs import raw_inputs

    x, A_log, dt_bias = raw_inputs(300, 2, "flashkda")  # 19 chunks: 4 segments of 5, the last one of 4
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    options = dict(fused=configs.LOWER_BOUND.fused_spec(), A_log=A_log, dt_bias=dt_bias, state_v_first=True,
                   segment_chunks=5)  # fmt: skip
    kernels = EmulatedKernels(emulated, 132)
    o_ref, s_ref = kernels.run("small_bh", *args, **options)
    route_ws = kernels.workspace.clone()
    at_fn = kernels.lib.kdactl_overlap_all_warm_at
    at_fn.restype = ctypes.c_int64
    at = at_fn(ctypes.byref(kernels.args))
    assert 0 <= at <= route_ws.numel() - 4
    assert route_ws[at : at + 4].any(), "the route did not find every segment warm: the test's draw changed"

    kernels.run("small_bh", *args, entry="kdactl_overlap_prepare", **options)
    prepared = kernels.workspace.clone()
    size_fn = kernels.lib.kdactl_overlap_prepared_bytes
    size_fn.restype = ctypes.c_uint64
    size = size_fn(ctypes.byref(kernels.args))
    assert 0 < size < at and torch.equal(prepared[:size], route_ws[:size])  # the blocks and bounds, bit for bit
    prepared[at : at + 4] = route_ws[at : at + 4]
    o, s = kernels.run("small_bh", *args, entry="kdactl_overlap_walk", workspace_from=prepared, **options)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)

    prepared[at : at + 4] = 0  # "not every segment starts warm": the route's other walk would run, not this one
    o, s = kernels.run("small_bh", *args, entry="kdactl_overlap_walk", workspace_from=prepared, **options)
    assert o.isnan().all() and s.isnan().all()


@pytest.mark.nvcc
@pytest.mark.parametrize("sms", [132, 16])  # kReduce's grid in one wave (segments walked in halves), and not
def test_past_the_all_warm_answer_the_walk_is_kreduce_with_m_slots(emulated, sms):
    """Past KDACTL_SMALL_BH_MAX_UNSTITCHED segments the route launches kReduce with an M slot a unit (and
    walks a known segment in halves where that grid fits the SMs once), then a stitch and a replay that
    return where every segment starts warm. The probe's walk is that kReduce: on the probe's prepare, o and
    the final state are the route's bit for bit. (Its grid's M slots show in the bits; whether it walks in
    halves does not at this draw, whose warm starts drop less history than fp32 resolves.)"""
    from kdactl.bench import configs
    from kdactl.kernel_abi import SMALL_BH_MAX_UNSTITCHED
    from tests.emu.kernels import EmulatedKernels
    from tests.kda_inputs import raw_inputs

    x, A_log, dt_bias = raw_inputs(16 * 57 + 5, 2, "flashkda")  # 58 chunks: 6 segments of 10, the last of 8
    assert 6 > SMALL_BH_MAX_UNSTITCHED
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    options = dict(fused=configs.LOWER_BOUND.fused_spec(), A_log=A_log, dt_bias=dt_bias, state_v_first=True,
                   segment_chunks=10)  # fmt: skip
    kernels = EmulatedKernels(emulated, sms)
    o_ref, s_ref = kernels.run("small_bh", *args, **options)
    kernels.run("small_bh", *args, entry="kdactl_overlap_prepare", **options)
    o, s = kernels.run("small_bh", *args, entry="kdactl_overlap_walk", workspace_from=kernels.workspace.clone(),
                       **options)  # fmt: skip
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)
