"""tools/ahead_probe.py, the measurement of route small_bh's prepare split ahead of and beside its walk: its
split on the CPU, and (nvcc tier) that tools/ahead_probe.cu compiles for sm_90a with no register spilled and,
on the emulator, gives small_bh's bits in every thread order, refuses a segment it cannot start warm, and
fails once its walks stop waiting for the chunks their CTA prepares."""

import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import load_tool

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(scope="module")
def probe():
    return load_tool("ahead_probe")


@pytest.mark.parametrize(("seg", "fraction", "ahead"), [(187, 0.55, 103), (187, 1.0, 179), (10, 0.5, 2), (10, 0.0, 0),
                                                         (9, 0.9, 1), (24, 0.45, 11)])  # fmt: skip
def test_the_split_leaves_the_tail_to_the_ahead_kernel(probe, seg, fraction, ahead):
    assert probe.ahead_chunks(seg, fraction) == ahead
    assert 0 <= ahead <= seg - probe.TAIL


def test_the_tail_is_the_kernels(probe):
    text = (TOOLS / "ahead_probe.cu").read_text()
    assert "constexpr int kTail = kWarmLoads;" in text
    assert "constexpr int kWarmLoads = 8;" in (TOOLS.parent / "csrc" / "kda_chunk.cuh").read_text()
    assert probe.TAIL == 8


@pytest.mark.nvcc
def test_the_probe_compiles_for_sm90a_without_spills(probe, tmp_path):
    """Two walk warpgroups at 184 registers a thread and a prepare warpgroup at 136 share what the CTA got at
    launch (setmaxnreg); a walk that no longer fits spills, which the measurement would pay for."""
    so = tmp_path / "probe.so"
    done = subprocess.run(probe.compile_command(so, source=probe.SOURCE), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    kernels = [i for i, line in enumerate(lines) if "Function properties for" in line and "kda_ahead" in line]
    assert len(kernels) == 2, done.stderr[-3000:]
    for i in kernels:
        assert "0 bytes spill stores, 0 bytes spill loads" in lines[i + 1], lines[i : i + 3]


@pytest.fixture(scope="module")
def includes(nvcc_toolkit):
    from tests.emu.build import cuda_includes

    return cuda_includes(nvcc_toolkit.nvcc)


@pytest.fixture(scope="module")
def emulated(includes, tmp_path_factory):
    """The emulated kernel library (tests/emu) with the probe built in."""
    from kdactl.assets import csrc_dir
    from tests.emu.build import build

    return build(csrc_dir(), includes, tmp_path_factory.mktemp("emu"), extra=(TOOLS / "ahead_probe.cu",))


def _call(T, draw, segment_chunks=10):
    from kdactl.bench import configs
    from tests.kda_inputs import raw_inputs

    x, A_log, dt_bias = raw_inputs(T, 2, draw)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    options = dict(fused=configs.LOWER_BOUND.fused_spec(), A_log=A_log, dt_bias=dt_bias, state_v_first=True,
                   segment_chunks=segment_chunks)  # fmt: skip
    return args, options


def _run(library, schedule, ahead, args, options):
    """(o, final state, whether a segment started cold) of one emulated probe call."""
    from tests.emu.kernels import EmulatedKernels

    kernels = EmulatedKernels(library, 132, schedule)
    kernels.lib.kdactl_ahead_probe_chunks(ahead)
    o, s = kernels.run("small_bh", *args, entry="kdactl_ahead_probe", **options)
    return o, s, bool(kernels.workspace[-4:].any())


# 40 chunks in 4 segments of 10 (walked with the all-warm plan's kReduce CTAs), and 58 chunks, the last one
# partial, in 6 (past KDACTL_SMALL_BH_MAX_UNSTITCHED: kReduce's E slots)
SHAPES = [640, 16 * 57 + 5]


@pytest.mark.nvcc
@pytest.mark.parametrize("T", SHAPES)
def test_the_probe_gives_small_bh_bits_in_every_thread_order(emulated, T):
    """The hand-over (a count in shared memory, polled) is race-free where the emulator can tell: o and the
    final state are small_bh's at the same segments, bit for bit, for every split of the prepare (none ahead,
    some, all the probe takes, more than that: clamped) and whichever order the threads run in."""
    from tests.emu.kernels import EVERY_ORDER, FORWARD, EmulatedKernels

    args, options = _call(T, "flashkda")
    o_ref, s_ref = EmulatedKernels(emulated, 132, FORWARD).run("small_bh", *args, **options)
    for ahead in (0, 1, 2, 9):
        for schedule in EVERY_ORDER:
            o, s, cold = _run(emulated, schedule, ahead, args, options)
            assert not cold, "a segment did not start warm"
            assert torch.equal(o, o_ref) and torch.equal(s, s_ref), f"ahead {ahead}, schedule {schedule}"


@pytest.mark.nvcc
def test_a_segment_that_does_not_start_warm_is_refused(emulated):
    """A model at initialization barely decays: no segment start forgets its history within 8 chunks, and the
    probe says so in the workspace's last word instead of walking from a guess."""
    from tests.emu.kernels import FORWARD

    args, options = _call(640, "init")
    assert _run(emulated, FORWARD, 1, args, options)[2]


@pytest.mark.nvcc
def test_walks_that_do_not_wait_for_their_chunks_fail(includes, tmp_path):
    """The emulator can tell a missing hand-over: without the wait, a walk reads blocks its CTA's prepare
    warps have not written yet."""
    from kdactl.assets import csrc_dir
    from tests.emu.build import build
    from tests.emu.kernels import REVERSE, EmulatedKernels

    wait = "    while (done[i % kPrepWarps] <= i / kPrepWarps) spin_pause();\n"
    text = (TOOLS / "ahead_probe.cu").read_text()
    assert text.count(wait) == 1, "the wait moved"
    faulty = tmp_path / "ahead_probe.cu"
    faulty.write_text(text.replace(wait, "    (void)done;\n"))
    library = build(csrc_dir(), includes, tmp_path / "lib", extra=(faulty,))
    args, options = _call(SHAPES[1], "flashkda")
    o_ref, s_ref = EmulatedKernels(library, 132).run("small_bh", *args, **options)
    o, s, _ = _run(library, REVERSE, 1, args, options)
    assert not (torch.equal(o, o_ref) and torch.equal(s, s_ref))
