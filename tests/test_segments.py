"""kdactl.kda.segments: which of small_bh's segments start warm, from the bounds its prepare pass left,
following csrc's warm_start step for step (its constants read from the header here)."""

import re

import pytest

from kdactl.assets import csrc_dir
from kdactl.kda.segments import DROP_LOG2, MIN_HALVED_CHUNKS, WARM_CHUNKS, SegmentStarts, segment_starts, warm_start


def test_constants_are_the_headers():
    text = (csrc_dir() / "kda_chunk.cuh").read_text()
    assert float(re.search(r"constexpr float kDropLog2 = (-?[0-9.]+)f;", text).group(1)) == DROP_LOG2
    assert int(re.search(r"constexpr int kWarmChunks = ([0-9]+);", text).group(1)) == WARM_CHUNKS
    assert int(re.search(r"constexpr int kMinHalvedChunks = ([0-9]+);", text).group(1)) == MIN_HALVED_CHUNKS


@pytest.mark.parametrize(
    "bound,first,start",
    [
        (-25.0, 40, 39),  # one chunk forgets enough
        (-10.0, 40, 38),  # two: -20 reaches the limit exactly
        (-0.625, 40, 8),  # thirty-two: the last one the walk takes
        (-0.6, 40, None),  # thirty-two chunks bound it to 2^-19.2 only: stitched
        (0.5, 40, None),  # a map that may grow the state
        (0.0, 5, 0),  # the walk reaches the sequence's start: exact from there
        (0.0, 32, 0),  # the last start that reaches it
        (0.0, 33, None),  # chunk 0's bound is never read: 32 chunks back from 33 end at chunk 1
    ],
)  # fmt: skip
def test_warm_start_walks_back_at_most_warm_chunks(bound, first, start):
    assert WARM_CHUNKS == 32
    assert warm_start([bound] * 64, first) == start


def test_warm_start_of_segment_zero_and_a_strong_chunk_among_weak_ones():
    assert warm_start([0.0] * 64, 0) == 0
    bounds = [0.0] * 64
    bounds[35] = -30.0  # the walk from 40 passes 39 .. 36 (sum 0) and stops at 35
    assert warm_start(bounds, 40) == 35


def test_segment_starts_counts_every_sequence_head_and_later_segment():
    # two sequences of 100 chunks (fixed layout: slots 0-99 and 101-200), 2 heads, segments of 40 chunks:
    # starts at chunks 40 and 80 of each (sequence, head), more than WARM_CHUNKS from the sequence's start
    slots = 2 * 100 + 2
    bounds = [[-25.0, 0.0] for _ in range(slots)]  # head 0 forgets in a chunk, head 1 never
    starts = segment_starts(bounds, [1600, 1600], 40)  # 3 segments a sequence: none is stitched
    assert starts == SegmentStarts(warm=4, stitched=0, walked_on=4, longest_walk=1)
    assert str(starts) == "4 of 8 segment starts warm (decay bound, up to 1 chunk back), 0 stitched, 4 walked without a stitch"
    assert str(SegmentStarts(warm=4, stitched=4)) == "4 of 8 segment starts warm (decay bound), 4 stitched"
    # 10 segments of 10 chunks (more than SMALL_BH_MAX_UNSTITCHED) are stitched; within WARM_CHUNKS of its
    # sequence's start a segment starts exactly from there, however weak the decay
    starts = segment_starts(bounds, [1600, 1600], 10)
    # head 1 from 40, 50, .. 90; 10, 20, 30 reach chunk 0, walking back 30 chunks at the most
    assert starts == SegmentStarts(warm=2 * 9 + 2 * 3, stitched=2 * 6, longest_walk=30)
    assert str(starts) == "24 of 36 segment starts warm (decay bound, up to 30 chunks back), 12 stitched"


def test_segment_starts_counts_the_known_segments_walked_in_halves():
    # one sequence of 240 chunks, 2 heads, segments of 40 (6 a sequence: stitched where cold); head 0 forgets
    # in a chunk everywhere, head 1 only in chunks 96 .. 104
    bounds = [[-25.0, -25.0 if 96 <= c <= 104 else 0.0] for c in range(241)]
    starts = segment_starts(bounds, [16 * 240], 40, halves=True)
    # head 0: all 6 segments known, every middle (20, 60, .. 220) warm; head 1: segment 0 known (middle 20
    # reaches chunk 0), segments 1, 2, 4, 5 start cold (stitched), segment 3 (from 120: 119 .. 105 sum 0,
    # 104 forgets) known and its middle 140 walks back 139 .. 108 without a forgetting chunk: whole
    assert starts == SegmentStarts(warm=5 + 1, stitched=4, halved=6 + 1, longest_walk=120 - 104), starts
    assert str(starts).endswith("4 stitched; 7 segments walked in two halves")
    no_halves = SegmentStarts(warm=6, stitched=4, longest_walk=16)  # the grid's two waves
    assert segment_starts(bounds, [16 * 240], 40) == no_halves
    # a known segment shorter than MIN_HALVED_CHUNKS is walked whole: 241 chunks, head 0's seventh (chunk 240)
    longer = segment_starts(bounds, [16 * 241], 40, halves=True)
    assert (longer.warm, longer.halved) == (6 + 1, 6 + 1), longer


def test_segment_starts_reads_a_varlen_batchs_slots():
    # lengths 40 (3 chunks, slots 0-2), 832 (52 chunks, from slot 40 // 16 + 1 = 3), 20 (2 chunks)
    lengths, slots = [40, 832, 20], 892 // 16 + 3
    bounds = [[0.0] for _ in range(slots)]
    for c in range(52):
        bounds[3 + c][0] = -25.0 if c == 28 else 0.0  # the second sequence's chunk 28 only
    # segments of 16 chunks: the first sequence has none after its first; the second starts 16, 32, 48;
    # the walk from 32 meets chunk 28 (warm), from 48 it reaches 28 within 32 chunks (warm), from 16 it
    # reaches chunk 0 of its own sequence (exact, warm); the third has one segment
    assert segment_starts(bounds, lengths, 16) == SegmentStarts(warm=3, stitched=0, longest_walk=48 - 28)
    bounds[3 + 28][0] = 0.0  # now only the start at 48 walks 32 chunks (47 .. 16) without reaching chunk 0:
    # a sequence of 4 segments is not stitched, one of 5 (12 chunks a segment) is
    assert segment_starts(bounds, lengths, 16) == SegmentStarts(warm=2, stitched=0, walked_on=1, longest_walk=32)
    # 12 and 24 reach chunk 0; 36, 48 stitched
    assert segment_starts(bounds, lengths, 12) == SegmentStarts(warm=2, stitched=2, longest_walk=24)


def test_bench_says_how_small_bhs_checked_call_started(monkeypatch):
    """kdactl bench's small_bh check: the lengths of the call's sequences (fixed or from cu_seqlens) go
    to starts_of_call with its workspace, and what it counts becomes the check's detail."""
    import torch

    from kdactl.bench import candidates
    from kdactl.bench.model import Check
    from kdactl.kda import segments
    from kdactl.kda.problem import KdaProblem
    from kdactl.kda.routes import DeviceInfo

    seen = []

    def starts_of_call(buffer, p, dev, lengths):
        seen.append((buffer, list(lengths)))
        return SegmentStarts(warm=5, stitched=1)

    monkeypatch.setattr(segments, "starts_of_call", starts_of_call)
    dev, ws = DeviceInfo(132, (9, 0), "sm_90a"), type("Ws", (), {"buffer": "the buffer"})()
    fixed = KdaProblem(2, 4096, 4, 128, 128, 2, False, False, False)
    check = candidates._with_segment_starts(lambda: Check(1e-4, 2e-4), ws, fixed, dev, {"cu_seqlens_cpu": None})
    result = check()
    assert (result.o_err, result.state_err) == (1e-4, 2e-4) and result.detail == str(SegmentStarts(5, 1))
    varlen = KdaProblem(1, 5000, 4, 128, 128, 3, True, False, False)
    candidates._with_segment_starts(lambda: Check(0, 0), ws, varlen, dev, {"cu_seqlens_cpu": torch.tensor([0, 1000, 1300, 5000])})()
    assert seen == [("the buffer", [4096, 4096]), ("the buffer", [1000, 300, 3700])]


def test_the_engines_call_reports_its_starts_through_the_same_call_into_a_workspace(monkeypatch):
    """auto in a fused configuration runs the engine's chunk_kda, whose workspace is its own: after its
    check, the same call through prefill fills the bench's workspace, whose bounds are then read."""
    from kdactl.bench import candidates
    from kdactl.bench.model import Check
    from kdactl.kda import segments
    from kdactl.kda.problem import KdaProblem
    from kdactl.kda.routes import DeviceInfo

    order = []
    monkeypatch.setattr(segments, "starts_of_call", lambda *a: order.append("read") or SegmentStarts(3, 0))
    ws = type("Ws", (), {"buffer": "the buffer"})()
    p = KdaProblem(1, 4096, 4, 128, 128, 1, False, False, False)

    def check():
        order.append("check")
        return Check(1e-4, 2e-4)

    result = candidates._with_segment_starts(check, ws, p, DeviceInfo(132, (9, 0), "sm_90a"), {"cu_seqlens_cpu": None},
                                             fill=lambda: order.append("fill"))()  # fmt: skip
    assert order == ["check", "fill", "read"] and result.detail == str(SegmentStarts(3, 0))


def test_a_bench_report_that_cannot_read_the_starts_leaves_the_check_as_it_was(monkeypatch):
    from kdactl.bench import candidates
    from kdactl.bench.model import Check
    from kdactl.kda import segments
    from kdactl.kda.problem import KdaProblem
    from kdactl.kda.routes import DeviceInfo

    def broken(*args):
        raise RuntimeError("no library")

    monkeypatch.setattr(segments, "starts_of_call", broken)
    ws = type("Ws", (), {"buffer": None})()
    p = KdaProblem(1, 4096, 4, 128, 128, 1, False, False, False)
    result = candidates._with_segment_starts(lambda: Check(1e-4, 2e-4), ws, p, DeviceInfo(132, (9, 0), "sm_90a"),
                                             {"cu_seqlens_cpu": None})()  # fmt: skip
    assert result.ok and result.detail == "segment starts not read: RuntimeError: no library"
