"""The peers: other public KDA prefill kernels, called with the same math as kdactl on the same
inputs, each checked against the reference before it is timed (by the runner, as every candidate).

  fla       flash-linear-attention's ``fla.ops.kda.chunk_kda`` and ``fused_recurrent_kda`` with the
            configuration's in-kernel flags; FLA_FLASH_KDA=0, so fla's own Triton path is timed
  flashkda  MoonshotAI/FlashKDA's ``flash_kda.fwd``: the lower-bound configuration only
  cudnn     nvidia-cudnn-frontend's ``cudnn.linear_attention.kimi_delta_attention`` pinned to its
            Hopper plan ``kda_hopper_cuda``: log-space or lower-bound gates (not softplus)

A peer that does not import is unavailable and a configuration it cannot compute is rejected,
each with its reason, a note in the report: never an error of the run. Inputs a peer reads in
another dtype or layout (cuDNN's fp32 g and beta, int32 cu_seqlens, THD tensors) are converted
once, before its check, so that no conversion is inside the timed call; the values are the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kdactl.bench.candidates import checker, poisoned
from kdactl.bench.model import REJECTED, UNAVAILABLE, Candidate

FLA_NAMES = ("fla.chunk_kda", "fla.fused_recurrent_kda")
FLASHKDA_NAME = "flashkda.fwd"
CUDNN_NAME, CUDNN_PLAN = "cudnn.kda_hopper_cuda", "kda_hopper_cuda"


def peer_candidates(inputs, ref, peers: Sequence[str]) -> list[Candidate]:
    out: list[Candidate] = []
    for name in peers:
        out += ADAPTERS[name](inputs, ref)
    return out


def _unavailable(names, peer: str, err: BaseException) -> list[Candidate]:
    why = f"{peer}: not importable: {type(err).__name__}: {err}"
    return [Candidate(n, "peer", reason=why, reason_status=UNAVAILABLE) for n in names]


def _unsupported(names, why: str) -> list[Candidate]:
    return [Candidate(n, "peer", reason=why, reason_status=REJECTED) for n in names]


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown version"


def load_fla() -> tuple[Any, str]:
    """(fla.ops.kda module, version) with FlashKDA off (FLA_FLASH_KDA=0, set before fla is imported,
    so chunk_kda is fla's own Triton path); raises ImportError when fla is not installed."""
    os.environ["FLA_FLASH_KDA"] = "0"
    import fla  # noqa: F401
    from fla.ops import kda as fla_kda

    return fla_kda, getattr(fla, "__version__", "unknown")


def fla_candidates(inputs, ref, names: Sequence[str] = FLA_NAMES) -> list[Candidate]:
    try:
        fla_kda, version = load_fla()
    except Exception as err:  # noqa: BLE001 - a peer that does not import is a note, not a crash
        return _unavailable(names, "fla", err)
    x, config = inputs, inputs["config"]
    flags = config.fla_flags()
    gate = {"A_log": x["A_log"], "dt_bias": x["dt_bias"]} if config.fused else {}
    out = []
    for name, fn in zip(FLA_NAMES, (fla_kda.chunk_kda, fla_kda.fused_recurrent_kda)):
        if name not in names:
            continue
        chunk = fn is fla_kda.chunk_kda
        # safe_gate is chunk_kda's (its M=16 path for a bounded gate); the recurrent kernel has no such flag.
        kw = {**gate, **{k: v for k, v in flags.items() if chunk or k != "safe_gate"}}
        if chunk:
            kw["cu_seqlens_cpu"] = x["cu_seqlens_cpu"]

        def run(fn=fn, kw=kw):
            return fn(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], output_final_state=True,
                      cu_seqlens=x["cu_seqlens"], **kw)  # fmt: skip

        out.append(
            Candidate(name, "peer", run=run, check=checker(run, ref, config.state_v_first), note=f"fla {version}")
        )
    return out


def flashkda_candidates(inputs, ref) -> list[Candidate]:
    x, config = inputs, inputs["config"]
    H, K, V = x["v"].shape[2], x["q"].shape[-1], x["v"].shape[-1]
    if config.gate != "lower-bound" or not (config.qk_l2norm and config.beta_sigmoid):
        return _unsupported([FLASHKDA_NAME], f"flashkda: unsupported configuration {config.name}: FlashKDA computes only "
                                             "the lower-bound gate with q/k l2norm and beta sigmoid in the kernel")  # fmt: skip
    if K != 128 or V != 128:
        return _unsupported(
            [FLASHKDA_NAME], f"flashkda: unsupported head dims K={K}, V={V} (FlashKDA takes K = V = 128)"
        )
    try:
        import flash_kda
    except Exception as err:  # noqa: BLE001
        return _unavailable([FLASHKDA_NAME], "flashkda", err)
    N = x["q"].shape[0] if x["cu_seqlens"] is None else x["cu_seqlens"].numel() - 1
    o = torch.empty_like(x["v"])
    state = torch.empty(N, H, V, K, dtype=torch.float32, device=x["v"].device)  # FlashKDA's state is V-first
    dt_bias = x["dt_bias"].view(H, K)

    def run():
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K**-0.5, o, A_log=x["A_log"], dt_bias=dt_bias,
                      lower_bound=config.lower_bound, final_state=state, cu_seqlens=x["cu_seqlens"])  # fmt: skip
        return o, state

    return [Candidate(FLASHKDA_NAME, "peer", run=run, check=checker(poisoned(run, o, state), ref, True),
                      note="flash_kda built from source")]  # fmt: skip


def cudnn_candidates(inputs, ref) -> list[Candidate]:
    x, config = inputs, inputs["config"]
    if config.gate == "softplus":
        return _unsupported([CUDNN_NAME], "cudnn: unsupported configuration softplus: kimi_delta_attention computes "
                                          "log-space or lower-bound (safe_gate) gates only")  # fmt: skip
    try:
        from cudnn.linear_attention import kimi_delta_attention
    except Exception as err:  # noqa: BLE001
        return _unavailable([CUDNN_NAME], "cudnn", err)
    B, T, H, K = x["q"].shape
    thd = {key: x[key].reshape(B * T, *x[key].shape[2:]) for key in ("q", "k", "v")}
    # The kernel reads g, beta in fp32 and an int32 cu_seqlens: converted here, outside the timed call.
    g, beta = x["g"].float().reshape(B * T, H, K), x["beta"].float().reshape(B * T, H)
    cu = (x["cu_seqlens"] if x["cu_seqlens"] is not None else torch.arange(B + 1, device=g.device) * T).to(torch.int32)
    kw: dict[str, Any] = {
        "use_qk_l2norm_in_kernel": config.qk_l2norm,
        "use_beta_sigmoid_in_kernel": config.beta_sigmoid,
    }
    if config.gate == "lower-bound":
        kw.update(
            safe_gate=True, gate_lower_bound=config.lower_bound, a_log=x["A_log"], dt_bias=x["dt_bias"].view(H, K)
        )

    def run():
        return kimi_delta_attention(thd["q"], thd["k"], thd["v"], g, beta, cu, output_final_state=True,
                                    plan_name=CUDNN_PLAN, **kw)  # fmt: skip

    return [Candidate(CUDNN_NAME, "peer", run=run, check=checker(run, ref, True),
                      note=f"nvidia-cudnn-frontend {_version('nvidia-cudnn-frontend')}, plan {CUDNN_PLAN}")]  # fmt: skip


ADAPTERS: dict[str, Callable[[dict[str, Any], Any], list[Candidate]]] = {
    "fla": fla_candidates, "flashkda": flashkda_candidates, "cudnn": cudnn_candidates,
    # fla's chunk_kda alone: its token-serial fused_recurrent_kda takes minutes at long prefill shapes.
    "fla-chunk": lambda inputs, ref: fla_candidates(inputs, ref, FLA_NAMES[:1]),
}  # fmt: skip
