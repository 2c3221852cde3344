"""Inputs, the reference, and the candidates for one shape on the GPU: ``auto``, each route in
``kdactl.kda.ROUTES`` (routes that land later join with no change here), and the fla peers.

Inputs follow flash-linear-attention's own KDA tests: q and k L2-normalized per head, v ~ N(0,1),
g = logsigmoid(N(0,1)) in fp32 (per-key log-decay), beta = sigmoid(N(0,1)) in bf16 (q's dtype, as
fla's tests and serving stacks pass it). Every candidate is checked against ``kda_chunked`` (fp32,
on the GPU) before it is timed, and ``kda_chunked`` itself against the fp64 ``kda_recurrent`` on a
prefix. A wrong candidate is reported as failed and never timed.
"""

from __future__ import annotations

import logging
import os
import zlib
from typing import Any, Sequence

import torch

from kdactl.bench.model import UNAVAILABLE, Candidate, Check
from kdactl.bench.suites import Shape
from kdactl.kda.inputs import random_inputs
from kdactl.reference import error_ratio

log = logging.getLogger("kdactl.bench")

REF_CHUNK = 64  # kda_chunked chunk size: fp32, exponents only of G_t - G_s <= 0, so 64 is as exact as 16
PREFIX_TOKENS, PREFIX_HEADS = 64, 2
PREFIX_LIMIT = 1e-3  # fp32 chunked vs fp64 recurrent should be far below the SPEC's 5e-3
PEERS = ("fla",)


def make_inputs(shape: Shape, device) -> dict[str, Any]:
    """Deterministic per shape label (a seed from its CRC), generated on the device, with fla's
    test conventions: q and k normalized, g = logsigmoid(randn) in fp32, beta in bf16."""
    x, _, cu = random_inputs(shape.batch, shape.seqlen, shape.heads, shape.key_dim, shape.value_dim,
                             lengths=shape.seqlens, device=device, seed=zlib.crc32(shape.label.encode()),
                             g_range=None, beta_dtype=torch.bfloat16, normalize_q=True,
                             cu_dtype=torch.int64)  # fmt: skip
    # The host copy a serving engine keeps (fla and kdactl both take it): no call reads cu_seqlens back.
    return dict(x, cu_seqlens=cu, cu_seqlens_cpu=None if cu is None else cu.cpu())


def reference(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final_state) in fp32 from kda_chunked, after checking it against fp64 kda_recurrent on
    a prefix of the first sequence; RuntimeError if the two references disagree."""
    from kdactl.reference import kda_chunked, kda_recurrent

    x = inputs
    cu = x["cu_seqlens"]
    first = x["q"].shape[1] if cu is None else int(cu[1] - cu[0])
    n = max(1, min(PREFIX_TOKENS, first))
    pre = {key: x[key][:1, :n, :PREFIX_HEADS]  # the first sequence starts at token 0 either way
           for key in ("q", "k", "v", "g", "beta")}
    o64, s64 = kda_recurrent(**pre)
    o32, s32 = kda_chunked(**pre, chunk_size=REF_CHUNK)
    errs = (error_ratio(o64, o32), error_ratio(s64, s32))
    if max(errs) > PREFIX_LIMIT:
        raise RuntimeError(f"reference self-check failed: kda_chunked vs fp64 kda_recurrent on a {n}-token "
                           f"prefix: o {errs[0]:.2e}, state {errs[1]:.2e} (limit {PREFIX_LIMIT:.0e})")  # fmt: skip
    return kda_chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=cu, chunk_size=REF_CHUNK)


def _checker(call, ref):
    def check() -> Check:
        o, state = call()
        return Check(error_ratio(ref[0], o), error_ratio(ref[1], state))

    return check


def own_candidates(inputs, ref, routes: Sequence[str] | None, device) -> list[Candidate]:
    """``auto`` and the requested routes (all of ROUTES by default), each with preallocated outputs
    (poisoned with NaN before the check, so an unwritten element fails it) and its own workspace."""
    from kdactl.kda import ROUTES, KdaWorkspace, decide_route, eligibility, prefill, validate
    from kdactl.kda.op import device_info

    x = inputs
    routes = ("auto", *ROUTES) if routes is None else routes
    problem = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, x["cu_seqlens"])
    dev = device_info(device.index or 0)
    verdicts = eligibility(problem, dev)
    decision = decide_route(problem, dev, "auto")
    out: list[Candidate] = []
    for name in routes:
        if name != "auto" and name not in ROUTES:
            out.append(Candidate(name, "route", reason=f"route {name!r} is not in this build (ROUTES={ROUTES})"))
            continue
        if name != "auto" and verdicts[name] is not None:
            out.append(Candidate(name, "route", reason=verdicts[name]))
            continue
        o = torch.empty_like(x["v"])
        state = torch.empty(problem.num_seqs, problem.heads, problem.key_dim, problem.value_dim,
                            dtype=torch.float32, device=device)  # fmt: skip
        ws = KdaWorkspace(device)

        def run(name=name, o=o, state=state, ws=ws):
            return prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu_seqlens"], route=name,
                           cu_seqlens_cpu=x["cu_seqlens_cpu"], output_final_state=True, out=(o, state),
                           workspace=ws)  # fmt: skip

        def poisoned_run(run=run, o=o, state=state):
            o.fill_(float("nan"))
            state.fill_(float("nan"))
            return run()

        kind, note = ("auto", f"auto -> {decision.route}") if name == "auto" else ("route", "")
        out.append(Candidate(name, kind, run=run, check=_checker(poisoned_run, ref), note=note))
    return out


def load_fla() -> tuple[Any, str]:
    """(fla.ops.kda module, version) with FlashKDA off (FLA_FLASH_KDA=0, set before fla is imported,
    so chunk_kda is fla's own Triton path); raises ImportError when fla is not installed."""
    os.environ["FLA_FLASH_KDA"] = "0"
    import fla  # noqa: F401
    from fla.ops import kda as fla_kda

    return fla_kda, getattr(fla, "__version__", "unknown")


def peer_candidates(inputs, ref, peers: Sequence[str]) -> list[Candidate]:
    if "fla" not in peers:
        return []
    names = ("fla.chunk_kda", "fla.fused_recurrent_kda")
    try:
        fla_kda, _ = load_fla()
    except Exception as err:  # noqa: BLE001 - a peer that does not import is "unavailable", not a crash
        why = f"fla not importable: {type(err).__name__}: {err}"
        return [Candidate(n, "peer", reason=why, reason_status=UNAVAILABLE) for n in names]
    x = inputs
    out = []
    for name, fn in zip(names, (fla_kda.chunk_kda, fla_kda.fused_recurrent_kda)):

        host = {"cu_seqlens_cpu": x["cu_seqlens_cpu"]} if fn is fla_kda.chunk_kda else {}

        def run(fn=fn, host=host):
            return fn(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
                      output_final_state=True, cu_seqlens=x["cu_seqlens"], **host)  # fmt: skip

        out.append(Candidate(name, "peer", run=run, check=_checker(run, ref)))
    return out
