"""Cases both plan tables must judge alike: kdactl.kda.plans (Python) and kdactl_host (C++) key a
call by its metadata and check a planned varlen call's host copy of cu_seqlens, each with its own
code, and tests run each on these tables.

BOUNDS: (cu_seqlens_cpu, planned) for a call whose cu_seqlens has 3 entries and whose T is 64;
planned False sends the call down the full path (which raises the ValueError naming the fault).
MISSES: changes to the tensors() of a planned call that must miss its plan (the full path then
decides, and raises when the change is an error)."""

import torch

SEQLEN = 64
CU_SEQLENS = (0, 10, 64)  # the device tensor's values (3 entries)

BOUNDS = [
    ([0, 10, 64], True), ((0, 64, 64), True), (torch.tensor([0, 30, 64]), True),
    (torch.tensor([0, 30, 64], dtype=torch.int32), True),
    ([0, 70, 64], False), ([1, 10, 64], False), ([0, 10, 63], False), ([0, 64], False), ([0, True, 64], False),
    ([0, 10.0, 64], False), (torch.tensor([0.0, 10.0, 64.0]), False), (torch.tensor([[0, 10, 64]]), False),
]  # fmt: skip


def tensors(T=64, H=4, D=128, **change):
    """A call's tensors, in kdactl.kernel_abi.CALL_TENSORS order (CPU tensors: no kernel runs)."""
    x = dict(q=torch.randn(1, T, H, D), k=torch.randn(1, T, H, D), v=torch.randn(1, T, H, D),
             g=torch.randn(1, T, H, D), beta=torch.randn(1, T, H), initial_state=None, cu_seqlens=None, A_log=None,
             dt_bias=None, state_pool=None, state_indices=None)  # fmt: skip
    x.update(change)
    return tuple(x.values())


def _misaligned():
    flat = torch.empty(64 * 4 * 128 + 8)
    return flat[1 : 1 + 64 * 4 * 128].view(1, 64, 4, 128)  # contiguous, 4 bytes off


MISSES = {
    "g-dtype": dict(g=torch.randn(1, 64, 4, 128).to(torch.bfloat16)),
    "q-shape": dict(q=torch.randn(1, 32, 4, 128)),
    "q-not-contiguous": dict(q=torch.randn(1, 64, 128, 4).transpose(2, 3)),  # same shape
    "q-parameter": dict(q=torch.nn.Parameter(torch.randn(1, 64, 4, 128), requires_grad=False)),  # not exactly a Tensor
    "initial-state-given": dict(initial_state=torch.zeros(1, 4, 128, 128)),
    "q-misaligned": dict(q=_misaligned()),
}
