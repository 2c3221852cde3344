"""KDA (Kimi Delta Attention) prefill: the public op, its route selector and workspace.

Nothing here loads torch kernels or touches the GPU at import; the library is built or loaded on
the first call of ``prefill``. The route registry imports without torch (the bench options read it
where torch must not load); the names that need torch load it on first use.

One job per module: api (prefill), fla_api (fla's chunk_kda over it), validation (the argument
checks), problem (a call's plain facts), routes (route selection), fused (fla's input transforms),
plans (the planned eager path), launch (a decided call's launch), custom_op (the torch.compile op),
device (the kernel library, device facts, streams), workspace (caller-owned scratch), inputs
(random problems); the C ABI they share with the library is kdactl.kernel_abi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kdactl.kda.fused import Fused
from kdactl.kda.routes import ROUTES, DeviceInfo, RouteDecision, decide_route, eligibility, select_route
from kdactl.kda.tuning import Tuning

if TYPE_CHECKING:
    from kdactl.kda.api import prefill
    from kdactl.kda.fla_api import chunk_kda
    from kdactl.kda.problem import KdaProblem
    from kdactl.kda.validation import validate
    from kdactl.kda.workspace import KdaWorkspace

__all__ = [
    "ROUTES", "DeviceInfo", "Fused", "KdaProblem", "KdaWorkspace", "RouteDecision",
    "Tuning", "chunk_kda", "decide_route", "eligibility", "prefill", "select_route", "validate",
]  # fmt: skip
_TORCH_NAMES = {  # name -> the module that holds it and imports torch
    "prefill": "kdactl.kda.api", "chunk_kda": "kdactl.kda.fla_api", "KdaProblem": "kdactl.kda.problem",
    "validate": "kdactl.kda.validation", "KdaWorkspace": "kdactl.kda.workspace",
}  # fmt: skip


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        value = getattr(importlib.import_module(_TORCH_NAMES[name]), name)
        globals()[name] = value  # found once: prefill's callers look it up on every call
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
