"""``kdactl bench``: KDA prefill kernels timed against each other and against peers, with a cold L2,
counterbalanced (ABBA) order and reference checks first; per-SKU baselines and regression gates.

Importing this package touches neither torch nor the GPU; harness.py does, when a run starts.
"""

from kdactl.bench.runner import BenchOptions, run_bench

__all__ = ["BenchOptions", "run_bench"]
