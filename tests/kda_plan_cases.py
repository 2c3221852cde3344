"""Cases both plan tables must judge alike: kdactl.kda.plans (Python) and kdactl_host (C++) check a
planned varlen call's host copy of cu_seqlens with their own code, and tests run each on this table.

BOUNDS: (cu_seqlens_cpu, planned) for a call whose cu_seqlens has 3 entries and whose T is 64;
planned False sends the call down the full path (which raises the ValueError naming the fault)."""

import torch

SEQLEN = 64
CU_SEQLENS = (0, 10, 64)  # the device tensor's values (3 entries)

BOUNDS = [
    ([0, 10, 64], True), ((0, 64, 64), True), (torch.tensor([0, 30, 64]), True),
    (torch.tensor([0, 30, 64], dtype=torch.int32), True),
    ([0, 70, 64], False), ([1, 10, 64], False), ([0, 10, 63], False), ([0, 64], False), ([0, True, 64], False),
    ([0, 10.0, 64], False), (torch.tensor([0.0, 10.0, 64.0]), False), (torch.tensor([[0, 10, 64]]), False),
]  # fmt: skip
