"""How far back the state remembers, per chunk of 16 tokens, for the bench's inputs (CPU, fp64): the
norm of each chunk's state map and the bound route small_bh's warm starts use, and how many chunks a
segment must walk back before that bound reaches 2^-20 (csrc/kda_chunk.cuh kDropLog2, kWarmChunks), and how
many chunks the prepare pass takes through its steep path (some key's in-chunk decay past kShiftLimit
from the reference row, so that A and P are formed level by level: steep_a_p, about twice the pass's work).

    python3 tools/decay_bounds.py [--config lower-bound|softplus] [--gate-params test|init|flashkda] [--heads 8] [--chunks 24]

One line per head: exp(A_log), the median and largest ||T||_2 over the chunks, the same for the
bound, the warm-up chunks a segment start needs (median, worst; '-' past kWarmChunks: stitched), and the
share of its chunks that take the steep path; last, how steeply the chunks decay (each chunk's largest
decay among its keys, over every chunk and head)."""
import argparse
import math

import torch

from kdactl.bench import candidates
from kdactl.bench.configs import CONFIGS, GATE_PARAMS
from kdactl.bench.suites import fixed
from kdactl.kda.segments import WARM_CHUNKS, warm_start
from kdactl.reference import chunk_state_map, fused_inputs

C = 16
SHIFT_LIMIT, REF_ROW = 60.0, C // 2 - 1  # csrc/kda_chunk.cuh kShiftLimit, PrepSmem::kRefRow


def steep(g_chunk: torch.Tensor) -> bool:
    """Whether the prepare pass takes its steep path for a chunk of log decays g [C, K] (prepare_chunk)."""
    G = g_chunk.cumsum(0)
    ref = G[REF_ROW]
    return bool((ref < -SHIFT_LIMIT).any() or ((G - ref).abs() > SHIFT_LIMIT).any())


def warm_chunks(log2_bounds: list[float], first: int) -> int | None:
    """Chunks a segment starting at chunk ``first`` walks back (as the kernels decide it), else None."""
    start = warm_start(log2_bounds, first)
    return None if start is None else first - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lower-bound", choices=[c for c in CONFIGS if CONFIGS[c].fused])
    ap.add_argument("--gate-params", default="test", choices=list(GATE_PARAMS))
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=24)
    args = ap.parse_args()
    shape = fixed(1, args.chunks * C, args.heads)
    shape = type(shape)(**{**shape.__dict__, "config": args.config, "gate_params": args.gate_params})
    x = candidates.make_inputs(shape, torch.device("cpu"))
    q, k, g, beta = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], x["config"].fused_spec(), x["A_log"], x["dt_bias"])
    print(f"{args.config}, gate parameters {args.gate_params}: per head, over {args.chunks} chunks of {C} tokens")
    for h in range(args.heads):
        norms, bounds, steeps = [], [], 0
        for c in range(args.chunks):
            rows = slice(c * C, (c + 1) * C)
            steeps += steep(g[0, rows, h].double())
            T, bound = chunk_state_map(k[0, rows, h], g[0, rows, h], beta[0, rows, h])
            norms.append(torch.linalg.matrix_norm(T, 2).item())
            bounds.append(bound.item())
        log2 = [math.log2(b) if b > 0 else -math.inf for b in bounds]
        walks = [warm_chunks(log2, first) for first in range(WARM_CHUNKS, args.chunks)]
        done = sorted(w for w in walks if w is not None)
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        warm = f"{med(done)} / {max(done)}" if len(done) == len(walks) else f"- ({len(walks) - len(done)} of {len(walks)} stitched)"
        print(f"  head {h}: exp(A_log) {x['A_log'][h].exp().item():5.2f}  ||T|| median {med(norms):.1e} max {max(norms):.1e}"
              f"  bound median {med(bounds):.1e} max {max(bounds):.1e}  warm-up chunks {warm}  steep {steeps / args.chunks:.0%}")
    # How steep: a chunk's largest decay over its 16 tokens among the keys, in nats (-G at its last row).
    spread = -g[0].double().view(args.chunks, C, args.heads, -1).sum(1).amin(-1)  # [chunks, heads]
    p10, p50, p90 = torch.quantile(spread.flatten(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    print(f"largest decay over a chunk among the keys (nats), over every (chunk, head): 10 % {p10:.0f}, "
          f"median {p50:.0f}, 90 % {p90:.0f} (kShiftLimit: {SHIFT_LIMIT:.0f} either side of the reference row)")


if __name__ == "__main__":
    main()
