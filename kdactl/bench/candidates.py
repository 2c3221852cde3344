"""Inputs, the reference, and kdactl's own candidates for one shape on the GPU: ``auto`` and
each route in ``kdactl.kda.ROUTES`` (routes that land later join with no change here); the peers
are in peers.py.

Inputs depend on the shape's configuration (kdactl.bench.configs). Plain follows
flash-linear-attention's own KDA tests: q and k L2-normalized per head, v ~ N(0,1),
g = logsigmoid(N(0,1)) in fp32 (per-key log-decay), beta = sigmoid(N(0,1)) in bf16. The fused
configurations draw raw logits (configs.RAW_INPUTS and GATE_PARAMS say which, and from where) and their
reference applies the same transforms in fp64 (kdactl.reference.fused_inputs) first. Every
candidate is checked against ``kda_chunked`` (fp32, on the GPU) before it is timed, and
``kda_chunked`` itself against the fp64 ``kda_recurrent`` on a prefix. A wrong candidate is reported
as failed and never timed. States are compared K-first: a V-first state is transposed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kdactl.bench.configs import CONFIGS, Config
from kdactl.bench.model import Candidate, Check
from kdactl.bench.suites import Shape
from kdactl.kda.inputs import cu_seqlens_of, random_inputs
from kdactl.reference import error_ratio

log = logging.getLogger("kdactl.bench")

REF_CHUNK = 64  # kda_chunked chunk size: fp32, exponents only of G_t - G_s <= 0, so 64 is as exact as 16
PREFIX_TOKENS, PREFIX_HEADS = 64, 2
PREFIX_LIMIT = 1e-3  # fp32 chunked vs fp64 recurrent should be far below the SPEC's 5e-3


def make_inputs(shape: Shape, device) -> dict[str, Any]:
    """Deterministic per shape label (a seed from its CRC), generated on the device. ``config`` is
    the shape's Config; ``A_log`` / ``dt_bias`` are None for a gate given in log space."""
    config = CONFIGS[shape.config]
    seed = zlib.crc32(shape.label.encode())
    if config.fused:
        x, cu = _raw_inputs(shape, device, seed)
    else:
        x, _, cu = random_inputs(shape.batch, shape.seqlen, shape.heads, shape.key_dim, shape.value_dim,
                                 lengths=shape.seqlens, device=device, seed=seed, g_range=None,
                                 beta_dtype=torch.bfloat16, normalize_q=True, cu_dtype=torch.int64)  # fmt: skip
        x.update(A_log=None, dt_bias=None)
    # The host copy a serving engine keeps (fla and kdactl both take it): no call reads cu_seqlens back.
    return dict(x, config=config, cu_seqlens=cu, cu_seqlens_cpu=None if cu is None else cu.cpu())


def _raw_inputs(shape: Shape, device, seed: int):
    """Raw projections as an engine hands them to a kernel that fuses the transforms (configs.RAW_INPUTS)."""
    B, T, H, K, V = shape.batch, shape.seqlen, shape.heads, shape.key_dim, shape.value_dim
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device)

    bf16 = torch.bfloat16
    x = dict(q=randn(B, T, H, K).to(bf16), k=randn(B, T, H, K).to(bf16), v=randn(B, T, H, V).to(bf16),
             g=randn(B, T, H, K).to(bf16), beta=randn(B, T, H).to(bf16))  # fmt: skip
    x["A_log"], x["dt_bias"] = gate_params(shape.gate_params, H, K, gen, device)
    cu = None if shape.seqlens is None else cu_seqlens_of(shape.seqlens, device, torch.int64)
    return x, cu


def gate_params(name: str, H: int, K: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_log [H], dt_bias [H*K]) in fp32, drawn as configs.GATE_PARAMS[name] says."""
    if name in ("test", "init"):
        A_log = torch.log(1 + 15 * torch.rand(H, generator=gen, device=device))
        if name == "test":
            return A_log, torch.randn(H * K, generator=gen, device=device)
        dt = torch.exp(math.log(1e-3) + math.log(100.0) * torch.rand(H * K, generator=gen, device=device))
        return A_log, dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
    if name == "flashkda":
        return torch.rand(H, generator=gen, device=device), torch.rand(H * K, generator=gen, device=device)
    raise ValueError(f"no draw for gate parameters {name!r}")


def recurrence_inputs(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """q, k, v, g, beta as the recurrence sees them: for a fused configuration, the transforms
    applied in fp64 (kdactl.reference.fused_inputs) and kept in fp32, the precision of kda_chunked."""
    x = inputs
    if not x["config"].fused:
        return {key: x[key] for key in ("q", "k", "v", "g", "beta")}
    from kdactl.reference import fused_inputs

    q, k, g, beta = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], x["config"].fused_spec(),
                                 x["A_log"], x["dt_bias"])  # fmt: skip
    return dict(q=q.float(), k=k.float(), v=x["v"], g=g.float(), beta=beta.float())


def reference(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final_state [N, H, K, V]) in fp32 from kda_chunked, after checking it against fp64
    kda_recurrent on a prefix of the first sequence; RuntimeError if the two references disagree."""
    from kdactl.reference import kda_chunked, kda_recurrent

    x = recurrence_inputs(inputs)
    cu = inputs["cu_seqlens"]
    first = x["q"].shape[1] if cu is None else int(cu[1] - cu[0])
    n = max(1, min(PREFIX_TOKENS, first))
    pre = {key: t[:1, :n, :PREFIX_HEADS] for key, t in x.items()}  # the first sequence starts at token 0 either way
    o64, s64 = kda_recurrent(**pre)
    o32, s32 = kda_chunked(**pre, chunk_size=REF_CHUNK)
    errs = (error_ratio(o64, o32), error_ratio(s64, s32))
    if max(errs) > PREFIX_LIMIT:
        raise RuntimeError(f"reference self-check failed: kda_chunked vs fp64 kda_recurrent on a {n}-token "
                           f"prefix: o {errs[0]:.2e}, state {errs[1]:.2e} (limit {PREFIX_LIMIT:.0e})")  # fmt: skip
    return kda_chunked(**x, cu_seqlens=cu, chunk_size=REF_CHUNK)


def checker(call, ref, state_v_first: bool = False):
    """A check that makes one call and compares (o, final state) with the reference; o is reshaped
    to the reference's [B, T, H, V] (a THD peer returns [T, H, V]), a V-first state transposed."""

    def check() -> Check:
        o, state = call()[:2]
        o = o.reshape(ref[0].shape) if o is not None and o.numel() == ref[0].numel() else o
        if state is not None and state_v_first:
            state = state.transpose(-1, -2)
        return Check(error_ratio(ref[0], o), error_ratio(ref[1], state))

    return check


def poisoned(run: Callable[[], Any], *outputs: torch.Tensor) -> Callable[[], Any]:
    """``run`` after filling its preallocated outputs with NaN: an element it leaves unwritten fails the check."""

    def call():
        for t in outputs:
            t.fill_(float("nan"))
        return run()

    return call


def own_candidates(inputs, ref, routes: Sequence[str] | None, device) -> list[Candidate]:
    """``auto`` and the requested routes (all of ROUTES by default). Routes run through
    kdactl.kda.prefill with preallocated outputs (poisoned with NaN before the check, so an unwritten
    element fails it) and their own workspace. In a fused configuration ``auto`` is called as an
    engine calls it: through kdactl.kda.chunk_kda, fla's signature, with fla's flags. Every small_bh
    check reports its segment starts from its workspace (auto in a fused configuration, whose engine
    call keeps its own, through the same call into one here)."""
    from kdactl.kda import ROUTES, KdaWorkspace, decide_route, eligibility, prefill, validate
    from kdactl.kda.device import device_info
    from kdactl.kda.routes import route_detail

    x, config = inputs, inputs["config"]
    routes = ("auto", *ROUTES) if routes is None else routes
    problem = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, x["cu_seqlens"],
                       state_v_first=config.state_v_first)  # fmt: skip
    dev = device_info(device.index or 0)
    verdicts = eligibility(problem, dev)
    decision = decide_route(problem, dev, "auto")
    fused = dict(fused=config.fused_spec(), A_log=x["A_log"], dt_bias=x["dt_bias"], state_v_first=config.state_v_first)
    out: list[Candidate] = []
    for name in routes:
        if name != "auto" and name not in ROUTES:
            out.append(Candidate(name, "route", reason=f"route {name!r} is not in this build (ROUTES={ROUTES})"))
            continue
        if name != "auto" and verdicts[name] is not None:
            out.append(Candidate(name, "route", reason=verdicts[name]))
            continue
        route = decision.route if name == "auto" else name  # what this candidate runs
        detail = route_detail(problem, dev, route)
        if name == "auto":
            kind, note = "auto", f"auto -> {decision.route}" + (f" ({detail})" if detail else "")
        else:
            kind, note = "route", detail
        ws = KdaWorkspace(device)

        def call(out=None, name=name, ws=ws):
            return prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu_seqlens"], route=name,
                           cu_seqlens_cpu=x["cu_seqlens_cpu"], output_final_state=True, out=out, workspace=ws,
                           **fused)  # fmt: skip

        if name == "auto" and config.fused:
            engine = _engine_call(x, config)
            check = checker(engine, ref, config.state_v_first)
            if route == "small_bh":
                check = _with_segment_starts(check, ws, problem, dev, x, fill=call)
            out.append(Candidate(name, kind, run=engine, check=check, note=note))
            continue
        o = torch.empty_like(x["v"])
        state = torch.empty(problem.num_seqs, problem.heads, *problem.state_shape, dtype=torch.float32, device=device)

        def run(call=call, o=o, state=state):
            return call((o, state))

        check = checker(poisoned(run, o, state), ref, config.state_v_first)
        if route == "small_bh":
            check = _with_segment_starts(check, ws, problem, dev, x)
        out.append(Candidate(name, kind, run=run, check=check, note=note))
    return out


def _with_segment_starts(check, ws, problem, dev, x, fill=None):
    """small_bh's check, saying how the checked call's segments started (kdactl.kda.segments): from
    the bounds it left in its workspace, read back before anything else runs on it. ``fill``: for a
    call that keeps its workspace to itself (the engine's chunk_kda), the same call through prefill
    into ``ws``, run after the check (the bounds depend on the inputs only)."""
    from kdactl.kda.segments import starts_of_call

    cu = None if x["cu_seqlens_cpu"] is None else x["cu_seqlens_cpu"].tolist()
    lengths = [problem.seqlen] * problem.num_seqs if cu is None else [b - a for a, b in zip(cu, cu[1:], strict=False)]

    def checked() -> Check:
        result = check()
        try:
            if fill is not None:
                fill()
            detail = str(starts_of_call(ws.buffer, problem, dev, lengths))
        except Exception as err:  # noqa: BLE001 - a report beside a correct call must not fail it
            detail = f"segment starts not read: {type(err).__name__}: {err}"
        return dataclasses.replace(result, detail=detail)

    return checked


def _engine_call(x, config: Config):
    """kdactl.kda.chunk_kda as vLLM / SGLang call fla's: raw logits, the configuration's flags."""
    from kdactl.kda import chunk_kda

    def run():
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True, A_log=x["A_log"],
                         dt_bias=x["dt_bias"], cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"],
                         **config.fla_flags())  # fmt: skip

    return run
