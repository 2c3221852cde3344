"""One prefill call, described once: every tensor and option ``prefill`` takes, by name.

``prefill`` builds it, the full path validates it (``validated`` carries the values it settled), and
the plan tables, the launch and the custom op read it whole. A plan is kept under the call's
tensors' metadata and its options (``prefill`` builds that key where it builds the call: it runs
on every call). It is a tuple so that kdactl_host reads its leading fields by index in one native
step: the tensors in kdactl.kernel_abi.CALL_TENSORS order,
then ``out``, ``cu_seqlens_cpu`` and ``workspace`` (kdactl.kernel_abi.CALL_FIELDS, which
kdactl_host's check_abi compares with its own slots). Plain data: no torch here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kdactl.kda.tuning import AUTO, Tuning
from kdactl.kernel_abi import CALL_TENSORS


class PrefillCall(NamedTuple):
    q: Any
    k: Any
    v: Any
    g: Any
    beta: Any
    initial_state: Any = None
    cu_seqlens: Any = None
    A_log: Any = None
    dt_bias: Any = None
    state_pool: Any = None
    state_indices: Any = None
    out: Any = None  # o, or (o, final_state)
    cu_seqlens_cpu: Any = None
    workspace: Any = None  # a KdaWorkspace
    scale: Any = None
    output_final_state: bool = False
    route: str = "auto"
    tuning: Tuning = AUTO
    fused: Any = None  # a kdactl.kda.fused.Fused, or None: none
    state_v_first: bool = False
    checkpoint_every: Any = None
    checkpoints: Any = None
    checkpoint_dtype: Any = None


TENSOR_COUNT = len(CALL_TENSORS)  # the call's leading fields that are tensors
