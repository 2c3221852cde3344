"""The device self-test (csrc/selftest.cu): run it on a GPU and check every value against a pure
Python recomputation of the same integer arithmetic."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kdactl.jit.library import Kernels

MASK = 0xFFFFFFFF
BLOCK = 256  # kBlock in selftest.cu
WARP = 32
GOLDEN = 0x9E3779B9
DEFAULT_N = 50_001  # not a multiple of the block: the last block is partial
DEFAULT_SEED = 0x5EED1234


def mix(x: int) -> int:
    """selftest.cu mix(): a 32-bit integer hash."""
    x &= MASK
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK
    x ^= x >> 16
    return x


def expected_values(n: int, seed: int) -> list[int]:
    """out[i] for i < n. Every thread of the launched grid (ceil(n / 256) blocks of 256) takes part
    in the warp sums and the shared-memory tile, including those with index >= n."""
    if n <= 0:
        return []
    threads = -(-n // BLOCK) * BLOCK
    x = [mix(i ^ seed) for i in range(threads)]
    warp_sums = [sum(x[w : w + WARP]) & MASK for w in range(0, threads, WARP)]
    out = []
    for i in range(n):
        block_start = i - i % BLOCK
        neighbour = x[block_start + (i % BLOCK + 1) % BLOCK]
        out.append((x[i] + 3 * warp_sums[i // WARP] + (neighbour ^ GOLDEN)) & MASK)
    return out


@dataclass(frozen=True)
class SelftestResult:
    device: int
    n: int
    seed: int
    mismatches: int
    first_mismatch: dict[str, int] | None  # {"index", "expected", "actual"}
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "device": self.device,
            "n": self.n,
            "seed": self.seed,
            "mismatches": self.mismatches,
            "first_mismatch": self.first_mismatch,
            "duration_s": round(self.duration_s, 4),
        }


def compare(actual: list[int], expected: list[int]) -> tuple[int, dict[str, int] | None]:
    bad = [i for i, (a, e) in enumerate(zip(actual, expected)) if (a & MASK) != e]
    bad += list(range(min(len(actual), len(expected)), max(len(actual), len(expected))))
    if not bad:
        return 0, None
    i = bad[0]
    got = actual[i] & MASK if i < len(actual) else -1
    return len(bad), {"index": i, "expected": expected[i] if i < len(expected) else -1, "actual": got}


def run_selftest(kernels: Kernels, device: int = 0, n: int = DEFAULT_N, seed: int = DEFAULT_SEED) -> SelftestResult:
    """Launch kdactl_selftest on torch's current stream of ``device`` and check every value."""
    import torch

    from kdactl.jit.library import KernelError

    start = time.monotonic()
    with torch.cuda.device(device):
        kernels.check_device()
        out = torch.full((n,), -1, dtype=torch.int32, device=f"cuda:{device}")  # sentinel: unwritten shows
        stream = torch.cuda.current_stream(device)
        rc = kernels.lib.kdactl_selftest(
            ctypes.c_void_p(out.data_ptr()), n, seed & MASK, ctypes.c_void_p(stream.cuda_stream)
        )
        kernels.check(rc, "kdactl_selftest")
        try:
            stream.synchronize()
        except RuntimeError as err:  # a trap or fault inside the kernel surfaces here
            raise KernelError(f"kdactl_selftest kernel failed on cuda:{device}: {err}".splitlines()[0], -1) from None
        actual = out.cpu().tolist()
    mismatches, first = compare(actual, expected_values(n, seed))
    return SelftestResult(device, n, seed & MASK, mismatches, first, time.monotonic() - start)
