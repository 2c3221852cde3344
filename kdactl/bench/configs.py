"""The bench configurations: how a caller hands KDA its gate, q/k and beta, and which state layout
it keeps. Serving engines do not pass a precomputed log-space gate; they pass raw projections and
let the kernel apply the transforms (kdactl.kda.fused):

  plain        g log-space (precomputed), q/k already L2-normalized, beta in (0, 1), K-first state
  lower-bound  g raw logits, gate = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), lower_bound -5,
               q/k L2-normalized in the kernel, beta = sigmoid(logits) in the kernel, V-first fp32
               state: what FlashKDA computes (Kimi-K3, GLM through vLLM / SGLang)
  softplus     g raw logits, gate = -exp(A_log) * softplus(g + dt_bias), q/k L2-normalized and beta's
               sigmoid in the kernel, K-first state: Kimi-Linear through fla's chunk_kda

Plain data, no torch: suites and options name configurations without touching the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdactl.errors import UsageError

# The inputs the bench draws for each kind of gate (kdactl.bench.candidates), said in the report.
# Plain: fla's own KDA tests. Raw logits: g and beta ~ N(0, 1) as in fla's test_chunk (use_gate_in_kernel)
# and FlashKDA's tests/test_fwd.py; q, k unnormalized N(0, 1); the gate's parameters from GATE_PARAMS.
PLAIN_INPUTS = "q, k L2-normalized; g = logsigmoid(N(0,1)) fp32; beta = sigmoid(N(0,1)) bf16"
RAW_INPUTS = "q, k ~ N(0,1) bf16 (normalized in the kernel); g ~ N(0,1) bf16 raw logits; beta ~ N(0,1) bf16 logits"

# How A_log [H] and dt_bias [H*K] (fp32) are drawn for a gate computed from raw logits (--gate-params).
# They decide how strongly the gate decays, and so how far back the state remembers: where every key
# channel decays strongly, a sequence can be cut into pieces that start from zero a little early
# (cuDNN's kda_hopper_cuda does); where some channel barely decays, it cannot.
GATE_PARAMS: dict[str, str] = {
    "test": "A_log = log U(1,16), dt_bias ~ N(0,1): fla's test_chunk (some channels barely decay under the lower-bound "
            "gate; the softplus gate decays every channel)",
    "init": "A_log = log U(1,16), dt_bias = softplus^-1(dt), dt ~ logU(1e-3, 0.1): fla's KDA layer at initialization "
            "(weak decay)",
    "flashkda": "A_log ~ U(0,1), dt_bias ~ U(0,1): FlashKDA's tests/test_fwd.py (every channel decays strongly)",
}  # fmt: skip
DEFAULT_GATE_PARAMS = "test"


def gate_params_named(name: str) -> str:
    if name not in GATE_PARAMS:
        raise UsageError(f"--gate-params must be one of {', '.join(GATE_PARAMS)}, got {name!r}")
    return name


@dataclass(frozen=True)
class Config:
    name: str
    gate: str  # "log" (g as given), "lower-bound" or "softplus"
    lower_bound: float | None = None
    qk_l2norm: bool = False
    beta_sigmoid: bool = False
    state_v_first: bool = False

    def inputs(self, gate_params: str = DEFAULT_GATE_PARAMS) -> str:
        """The inputs the bench draws for this configuration (its gate's parameters by ``gate_params``)."""
        return f"{RAW_INPUTS}; {GATE_PARAMS[gate_params]}" if self.fused else PLAIN_INPUTS

    @property
    def summary(self) -> str:
        gate = {"log": "g log-space as given", "lower-bound": f"gate {self.lower_bound}*sigmoid(exp(A_log)*(g+dt_bias))",
                "softplus": "gate -exp(A_log)*softplus(g+dt_bias)"}[self.gate]  # fmt: skip
        parts = [gate, "q/k l2norm in kernel" if self.qk_l2norm else None, "beta sigmoid in kernel" if self.beta_sigmoid
                 else None, "V-first state" if self.state_v_first else "K-first state"]  # fmt: skip
        return ", ".join(p for p in parts if p)

    def fused_spec(self):
        """The kdactl.kda.fused.Fused that asks kdactl's kernels (and the reference) for these transforms."""
        from kdactl.kda.fused import BETA_AS_GIVEN, BETA_SIGMOID, GATE_AS_GIVEN, GATE_LOWER_BOUND, GATE_SOFTPLUS, Fused

        gate = {"log": GATE_AS_GIVEN, "lower-bound": GATE_LOWER_BOUND, "softplus": GATE_SOFTPLUS}[self.gate]
        beta = BETA_SIGMOID if self.beta_sigmoid else BETA_AS_GIVEN
        return Fused(self.qk_l2norm, beta, gate, self.lower_bound or 0.0)

    @property
    def fused(self) -> bool:
        """The gate is computed from raw logits inside the kernel (A_log, dt_bias are inputs)."""
        return self.gate != "log"

    def fla_flags(self) -> dict[str, Any]:
        """The keyword flags of fla's ``chunk_kda`` (and kdactl.kda.chunk_kda) for this
        configuration, tensors left out. The lower-bound gate goes with safe_gate, as engines call it."""
        flags: dict[str, Any] = {}
        if self.qk_l2norm:
            flags["use_qk_l2norm_in_kernel"] = True
        if self.beta_sigmoid:
            flags["use_beta_sigmoid_in_kernel"] = True
        if self.fused:
            flags["use_gate_in_kernel"] = True
        if self.gate == "lower-bound":
            flags.update(safe_gate=True, lower_bound=self.lower_bound)
        if self.state_v_first:
            flags["state_v_first"] = True
        return flags


PLAIN = Config("plain", "log")
LOWER_BOUND = Config("lower-bound", "lower-bound", lower_bound=-5.0, qk_l2norm=True, beta_sigmoid=True,
                     state_v_first=True)  # fmt: skip
SOFTPLUS = Config("softplus", "softplus", qk_l2norm=True, beta_sigmoid=True)
CONFIGS: dict[str, Config] = {c.name: c for c in (PLAIN, LOWER_BOUND, SOFTPLUS)}


def config_named(name: str) -> Config:
    if name not in CONFIGS:
        raise UsageError(f"--config must be one of {', '.join(CONFIGS)}, got {name!r}")
    return CONFIGS[name]
