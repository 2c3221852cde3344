"""Route small_bh's decisions, on a model: a sequence as affine chunk maps S_{c+1} = T_c S_c + E_c with
known norms, cut into segments, through the passes csrc/kda_small_bh.cu and csrc/kda_chunk.cuh run
(warm_start, the segments kReduce walks whole, the reductions it skips, the stitch's steps, the
replay's start). Every walk that writes o must start from the true state, to within the history a
warm start may drop (2^-20 of the state); over random patterns of strongly and weakly decaying
chunks, so that warm and stitched segments mix."""

from __future__ import annotations

import math
import random

import pytest
import torch

from kdactl.kda.segments import warm_start  # the kernels' warm_start, step for step

D = 6  # the model's state size


def walk(maps, adds, start_state, c0, c1):
    s = start_state
    for c in range(c0, c1):
        s = maps[c] @ s + adds[c]
    return s


def small_bh(maps, adds, s0, seg_chunks):
    """The passes as the kernels decide them: each segment's start state, the pass that walks it to
    its end (writing its o), and the end states the stitch reads."""
    chunks = len(maps)
    P = -(-chunks // seg_chunks)
    log2 = [math.log2(torch.linalg.matrix_norm(m, 2).item() or 2.0**-200) for m in maps]
    first = [p * seg_chunks for p in range(P)]
    end = [min(chunks, f + seg_chunks) for f in first]
    warm = [-1 if (c := warm_start(log2, f)) is None else c for f in first]  # -1: stitched
    zero = torch.zeros_like(s0)
    ends, mats, starts, writer = {}, {}, {}, {}
    for p in range(P):  # kReduce: even slots E, odd slots M
        known = warm[p] >= 0
        next_reads = p < P - 1 and warm[p + 1] < 0
        if known:  # walked whole: o from first[p] on, its absolute end state
            starts[p] = walk(maps, adds, s0 if warm[p] == 0 else zero, warm[p], first[p])
            ends[p] = walk(maps, adds, starts[p], first[p], end[p])
            writer.setdefault(p, []).append("reduce")
        elif next_reads:
            ends[p] = walk(maps, adds, zero, first[p], end[p])
            mats[p] = walk(maps, [torch.zeros_like(a) for a in adds], torch.eye(D, dtype=s0.dtype), first[p], end[p])
    start = ends.get(0)  # the stitch: S_1 = E_0
    for p in range(1, P - 1):
        if warm[p + 1] >= 0:
            continue
        if warm[p] >= 0:
            start = ends[p]  # E_p is S_{p+1} already
            continue
        start = mats[p] @ start + ends[p]
        ends[p] = start
    for p in range(P):  # kReplay: the stitched segments, from the stitched start
        if warm[p] < 0:
            starts[p] = ends[p - 1]
            writer.setdefault(p, []).append("replay")
    return [starts[p] for p in range(P)], warm, writer


def chunk_maps(pattern: str, gen: torch.Generator):
    """Maps of norm 1e-4 ('s': strong decay) or 0.9 ('w': weak), rotations scaled, and random adds."""
    maps, adds = [], []
    for kind in pattern:
        rotation, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64, generator=gen))
        maps.append(rotation * (1e-4 if kind == "s" else 0.9))
        adds.append(torch.randn(D, 1, dtype=torch.float64, generator=gen))
    return maps, adds


def case(seed: int):
    """A random sequence: runs of strong and weak chunks, a random segment length, and a start state."""
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    chunks = rnd.randint(4, 120)
    pattern = "".join(rnd.choice("sw") * rnd.randint(1, 12) for _ in range(chunks))[:chunks]
    maps, adds = chunk_maps(pattern, gen)
    return maps, adds, torch.randn(D, 1, dtype=torch.float64, generator=gen), rnd.randint(2, max(2, chunks // 2))


SEEDS = range(60)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_replay_starts_from_the_true_state(seed):
    maps, adds, s0, seg_chunks = case(seed)
    starts, warm, _ = small_bh(maps, adds, s0, seg_chunks)
    for p, s in enumerate(starts):
        truth = walk(maps, adds, s0, 0, p * seg_chunks)
        err = ((s - truth).norm() / truth.norm()).item()
        assert err <= 2.0**-19, (seed, p, warm[p], err)


def test_the_cases_mix_every_kind_of_start():
    """Warm starts past the sequence's start, walks from its start, and stitched starts all occur."""
    kinds = set()
    for seed in SEEDS:
        maps, adds, s0, seg_chunks = case(seed)
        _, warm, _ = small_bh(maps, adds, s0, seg_chunks)
        kinds |= {"warm" if w > 0 else "from the start" if w == 0 else "stitched" for w in warm[1:]}
    assert kinds == {"warm", "from the start", "stitched"}


@pytest.mark.parametrize("seed", SEEDS)
def test_every_segment_is_walked_to_its_end_once(seed):
    """Each segment's o is written by one pass: kReduce where its start is known (segment 0, a warm
    start), kReplay where it is stitched; so no chunk's o is written twice or never."""
    maps, adds, s0, seg_chunks = case(seed)
    _, warm, writer = small_bh(maps, adds, s0, seg_chunks)
    assert sorted(writer) == list(range(len(warm)))
    for p, passes in writer.items():
        assert passes == ["reduce" if warm[p] >= 0 else "replay"], (seed, p, passes)


def test_strong_decay_needs_no_second_pass():
    """Where every chunk forgets its history, every segment starts known: kReduce walks them all and
    kReplay has nothing to do."""
    gen = torch.Generator().manual_seed(7)
    maps, adds = chunk_maps("s" * 40, gen)
    _, warm, writer = small_bh(maps, adds, torch.randn(D, 1, dtype=torch.float64, generator=gen), 5)
    assert all(w >= 0 for w in warm) and all(passes == ["reduce"] for passes in writer.values())
