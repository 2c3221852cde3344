"""Trigger fla's Triton autotuning for given head counts (run one process per H in parallel), on the
same input dtypes kdactl bench uses."""
import os, sys
os.environ.setdefault("FLA_FLASH_KDA", "0")
import torch
from kdactl.bench.candidates import make_inputs
from kdactl.bench.suites import Shape
from fla.ops.kda import chunk_kda, fused_recurrent_kda

for H in map(int, sys.argv[1:]):
    x = make_inputs(Shape(1, 4096, H), "cuda")
    for fn in (chunk_kda, fused_recurrent_kda):
        fn(**x, output_final_state=True)
    torch.cuda.synchronize()
    print(f"warmed fla H={H}", flush=True)
