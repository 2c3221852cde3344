"""Trigger fla's Triton compilation and autotuning for given head counts (run one process per entry in
parallel), on the inputs and flags kdactl bench uses: entries H or H:CONFIG (a kdactl.bench.configs
name, plain by default), each warmed on a fixed and a varlen batch (fla compiles the two apart)."""
import os, sys
os.environ.setdefault("FLA_FLASH_KDA", "0")
import dataclasses
import torch
from kdactl.bench.candidates import make_inputs
from kdactl.bench.peers import fla_candidates
from kdactl.bench.suites import SERVING_VARLEN, fixed, varlen

for entry in sys.argv[1:]:
    H, _, config = entry.partition(":")
    for shape in (fixed(1, 4096, int(H)), varlen(SERVING_VARLEN, int(H))):
        x = make_inputs(dataclasses.replace(shape, config=config or "plain"), "cuda")
        for c in fla_candidates(x, None):
            if c.run is None:
                sys.exit(f"fla unusable: {c.reason}")
            c.run()
    torch.cuda.synchronize()
    print(f"warmed fla H={H} config={config or 'plain'}", flush=True)
