"""The input transforms fla's ``chunk_kda`` fuses into its kernels, which kdactl's kernels apply
where they load their inputs (csrc/device.cuh: ``gate_of``, ``load_beta``, the l2norm of the load
path), so that none of them is an extra pass over HBM:

  qk_l2norm   every q and k row used as x / sqrt(|x|^2 + 1e-6)            (use_qk_l2norm_in_kernel)
  beta_mode   beta as given, sigmoid(beta), or 2 sigmoid(beta)            (use_beta_sigmoid_in_kernel,
                                                                           allow_neg_eigval)
  gate_mode   g as given (the log decay), -exp(A_log) softplus(g + dt_bias),
              or lower_bound sigmoid(exp(A_log) (g + dt_bias))            (use_gate_in_kernel,
                                                                           lower_bound)

Plain data and no torch here: the codes are kdactl.kernel_abi's, checked against the kernel library
when it loads.
The torch reference of the same transforms is kdactl.reference.fused_inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdactl.kernel_abi import BETA_AS_GIVEN, BETA_SIGMOID, BETA_SIGMOID2, GATE_AS_GIVEN, GATE_LOWER_BOUND, GATE_SOFTPLUS

L2NORM_EPS = 1e-6  # fla's l2norm
SOFTPLUS_LINEAR_ABOVE = 20.0  # softplus(x) = x above this, as fla's softplus


@dataclass(frozen=True)
class Fused:
    """Which transforms a call asks for (the default: none)."""

    qk_l2norm: bool = False
    beta_mode: int = BETA_AS_GIVEN
    gate_mode: int = GATE_AS_GIVEN
    lower_bound: float = 0.0  # GATE_LOWER_BOUND only

    def __post_init__(self) -> None:
        if self.beta_mode not in (BETA_AS_GIVEN, BETA_SIGMOID, BETA_SIGMOID2):
            raise ValueError(f"kdactl.kda: beta_mode must be 0, 1 or 2, got {self.beta_mode!r}")
        if self.gate_mode not in (GATE_AS_GIVEN, GATE_SOFTPLUS, GATE_LOWER_BOUND):
            raise ValueError(f"kdactl.kda: gate_mode must be 0, 1 or 2, got {self.gate_mode!r}")
        if self.gate_mode == GATE_LOWER_BOUND and not self.lower_bound < 0:
            raise ValueError(f"kdactl.kda: lower_bound must be negative (a log decay), got {self.lower_bound!r}")

    @property
    def gated(self) -> bool:
        return self.gate_mode != GATE_AS_GIVEN


NONE = Fused()
