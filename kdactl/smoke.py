"""Route smokes shared by the validation suite (checks/) and the sanitizer payload: small KDA
problems, run on a named route and held to the fp64 reference (SPEC error ratio <= 5e-3).

A row names a shape class of the SKU matrix (fleet/skus.toml) and a problem well inside it; the
suite asserts the selector's pick for the row and runs every route in ROUTES that is eligible, so
routes that land later join without a change here. Imports torch: use only where a GPU is expected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdactl.bench.configs import CONFIGS, Config
from kdactl.faults import perturb_output
from kdactl.kda import KdaProblem, eligibility, prefill
from kdactl.kda.fused import NONE
from kdactl.kda.inputs import random_inputs
from kdactl.kda.routes import DeviceInfo
from kdactl.reference import ERROR_LIMIT as TOL
from kdactl.reference import error_ratio, fused_inputs, kda_recurrent

HEAD_DIM = 128  # K = V = 128, the size every route must support


@dataclass(frozen=True)
class SmokeRow:
    shape_class: str  # a SHAPE_CLASSES entry of kdactl.skus
    batch: int
    seqlen: int
    heads: int
    lengths: tuple[int, ...]  # the varlen variant: sequence lengths of one packed batch

    @property
    def name(self) -> str:
        return f"{self.shape_class}-B{self.batch}-T{self.seqlen}-H{self.heads}"


# The suite's route-boundary table: one row well inside each shape class, plus decode's edges.
SUITE_ROWS: tuple[SmokeRow, ...] = (
    SmokeRow("decode_like", 4, 8, 8, (8, 7, 0, 15)),
    SmokeRow("decode_like", 2, 1, 4, (1, 1)),
    SmokeRow("decode_like", 2, 12, 4, (12, 11, 1)),
    SmokeRow("serving", 2, 256, 32, (256, 100, 156)),
    SmokeRow("small_bh", 1, 4096, 2, (2800, 1296)),
)
# The sanitizer payload's problems: tiny, because every access is instrumented there.
PAYLOAD_ROWS: tuple[SmokeRow, ...] = (
    SmokeRow("decode_like", 2, 16, 2, (9, 0, 7)),
    SmokeRow("small_bh", 1, 96, 1, (64, 32)),
)


def problem_of(row: SmokeRow, varlen: bool) -> KdaProblem:
    """The problem facts of a row's fixed or varlen variant (fp32 g and beta)."""
    if varlen:
        return KdaProblem(1, sum(row.lengths), row.heads, HEAD_DIM, HEAD_DIM, len(row.lengths), True, False, False)
    return KdaProblem(row.batch, row.seqlen, row.heads, HEAD_DIM, HEAD_DIM, row.batch, False, False, False)


def ineligible_reason(route: str, row: SmokeRow, varlen: bool, device: DeviceInfo) -> str | None:
    """None when ``route`` can run the variant, else the selector's reason."""
    return eligibility(problem_of(row, varlen), device).get(route, f"route {route!r} is not in ROUTES")


def make_inputs(row: SmokeRow, varlen: bool, with_state: bool, device: torch.device, seed: int = 0):
    """(inputs dict, initial state or None, cu_seqlens or None) of the row's fixed or varlen variant."""
    lengths = row.lengths if varlen else None
    return random_inputs(row.batch, row.seqlen, row.heads, HEAD_DIM, HEAD_DIM, lengths=lengths,
                         device=device, seed=seed, with_state=with_state)  # fmt: skip


@dataclass(frozen=True)
class SmokeResult:
    route: str
    err_o: float
    err_state: float

    @property
    def ok(self) -> bool:
        return self.err_o <= TOL and self.err_state <= TOL

    def describe(self) -> str:
        verdict = "within" if self.ok else "OUTSIDE"
        return (f"route {self.route}: error ratio o={self.err_o:.2e} state={self.err_state:.2e} "
                f"({verdict} the tolerance {TOL:g})")  # fmt: skip


# The serving engines' calls, each with every transform the kernels fuse: Kimi Linear through fla's
# chunk_kda (the softplus gate, on grouped values) and Kimi-K3 / GLM through FlashKDA (the lower-bound
# gate, V-first states). Their names are kdactl.bench.configs CONFIGS entries.
SMOKE_CONFIGS: tuple[str, ...] = ("softplus", "lower-bound")


def fused_variant(x: dict, s0, config: Config, seed: int) -> tuple[dict, object, torch.Tensor, torch.Tensor]:
    """A row's inputs as ``config``'s call makes them: q and k not normalized, g raw, beta as logits,
    the softplus call with half the heads of q and k where the head count is even (grouped values),
    the V-first call with ``s0`` transposed; (inputs, initial state, A_log, dt_bias)."""
    gen = torch.Generator(device=x["q"].device).manual_seed(seed)
    B, T, H, K = x["g"].shape
    hq = H // 2 if H % 2 == 0 and config.gate == "softplus" else H
    raw = dict(x, q=(x["q"][:, :, :hq] * 3).contiguous(), k=(x["k"][:, :, :hq] * 2).contiguous(),
               g=torch.randn(B, T, H, K, generator=gen, device=x["g"].device),
               beta=torch.randn(B, T, H, generator=gen, device=x["g"].device))  # fmt: skip
    A_log = torch.rand(H, generator=gen, device=x["g"].device).mul_(2.7).log1p_()  # log of 1 + 2.7 U(0, 1)
    dt_bias = torch.randn(H * K, generator=gen, device=x["g"].device)
    if config.state_v_first and s0 is not None:
        s0 = s0.transpose(-1, -2).contiguous()
    return raw, s0, A_log, dt_bias


def run_smoke(route: str, row: SmokeRow, varlen: bool, with_state: bool, device: torch.device, ref_device: str = "cuda",
              seed: int = 0, config: str | None = None) -> SmokeResult:  # fmt: skip
    """Run ``route`` on the variant and compare o and the final state with the fp64 reference;
    ``config``: one of SMOKE_CONFIGS, the serving call with its transforms (fused_variant), else the
    plain call. Under KDACTL_FAULT=wrong-result:<route> the output is perturbed first (kdactl.faults)."""
    x, s0, cu = make_inputs(row, varlen, with_state, device, seed)
    spec, A_log, dt_bias, v_first = NONE, None, None, False
    if config is not None:
        call = CONFIGS[config]
        (x, s0, A_log, dt_bias), spec, v_first = fused_variant(x, s0, call, seed), call.fused_spec(), call.state_v_first
    o, state = prefill(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu, route=route, fused=spec,
                       A_log=A_log, dt_bias=dt_bias, state_v_first=v_first)  # fmt: skip
    torch.cuda.synchronize(device)
    o = perturb_output(route, o)
    if v_first:  # the reference keeps K-first states
        s0, state = (None if s0 is None else s0.transpose(-1, -2)), state.transpose(-1, -2)
    q, k, g, beta = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], spec, A_log, dt_bias)
    o_ref, s_ref = kda_recurrent(q, k, x["v"], g, beta, initial_state=s0, cu_seqlens=cu, device=ref_device)
    return SmokeResult(route, error_ratio(o_ref, o), error_ratio(s_ref, state))


# The serving engines' state handling: a pool of V-first states read and written in place by slot
# (one sequence starts from zero and writes nothing), fp16 inputs, prefix checkpoints every 32 tokens.
POOL_EXTRA_SLOTS = 2
POOL_CHECKPOINT_EVERY = 32


def pool_ineligible_reason(route: str, row: SmokeRow, device: DeviceInfo) -> str | None:
    """None when ``route`` can run the row's pool variant (varlen, with a state pool), else why not."""
    from dataclasses import replace

    return eligibility(replace(problem_of(row, True), state_pool=True), device).get(
        route, f"route {route!r} is not in ROUTES"
    )


def run_pool_smoke(route: str, row: SmokeRow, device: torch.device, ref_device: str = "cuda",
                   seed: int = 0) -> SmokeResult:  # fmt: skip
    """The row's varlen variant through a V-first state pool with checkpoints (fp16 q, k, v): o, the
    written slots and the checkpoints against the fp64 reference; err_state is the worse of the
    last two, and inf when a slot no sequence names was written."""
    x, _, cu = make_inputs(row, True, False, device, seed)
    x = {n: t.half() if n in ("q", "k", "v") else t for n, t in x.items()}
    N, H = len(row.lengths), row.heads
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    pool = torch.randn(N + POOL_EXTRA_SLOTS, H, HEAD_DIM, HEAD_DIM, generator=gen, device=device) * 0.5
    slots = [N + POOL_EXTRA_SLOTS - 1 - n for n in range(N)]
    slots[N // 2] = -1  # the middle sequence starts from zero and is not written back
    before = pool.clone()
    o, _, checkpoints = prefill(**x, cu_seqlens=cu, route=route, state_pool=pool, state_v_first=True,
                                state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
                                checkpoint_every=POOL_CHECKPOINT_EVERY)  # fmt: skip
    torch.cuda.synchronize(device)
    o = perturb_output(route, o)
    zero = torch.zeros_like(before[0])
    s0 = torch.stack([before[i].transpose(-1, -2) if i >= 0 else zero for i in slots])  # K-first for the reference
    o_ref, s_ref, c_ref = kda_recurrent(**x, initial_state=s0, cu_seqlens=cu, device=ref_device,
                                        checkpoint_every=POOL_CHECKPOINT_EVERY)  # fmt: skip
    written = [(n, i) for n, i in enumerate(slots) if i >= 0]
    err_slots = max(error_ratio(s_ref[n], pool[i].transpose(-1, -2)) for n, i in written)
    err_checkpoints = error_ratio(c_ref, checkpoints[0].transpose(-1, -2))
    untouched = [i for i in range(len(pool)) if i not in slots]
    if any(not torch.equal(pool[i], before[i]) for i in untouched):
        err_slots = float("inf")
    return SmokeResult(route, error_ratio(o_ref, o), max(err_slots, err_checkpoints))


def replay_equals_eager(graph, x, s0, cu, o, s, fresh, **call) -> None:
    """Copy ``fresh`` = (inputs, initial state) into the captured tensors in place, poison the
    outputs with NaN, replay ``graph`` and hold (o, s) to an eager call on the same inputs and with
    the captured call's ``route`` and ``tuning`` (``call``): recurrences of other widths may take other
    tensor-core instructions (sm_90a's wgmma or mma.sync), which round differently."""
    inputs, state = fresh
    for name, t in inputs.items():
        x[name].copy_(t)
    s0.copy_(state)
    o.fill_(float("nan"))
    s.fill_(float("nan"))
    graph.replay()
    o_eager, s_eager = prefill(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu, **call)
    torch.cuda.synchronize(o.device)
    assert torch.isfinite(o.float()).all() and torch.isfinite(s).all(), "replay left NaN in the outputs"
    assert torch.equal(o, o_eager) and torch.equal(s, s_eager), "replay differs from eager"


def second_capture_refused(x, workspace, o) -> None:
    """Capture one call with ``workspace`` (already sized by an eager call), then hold a second capture
    with the same workspace to the ValueError that names the owning capture."""
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        prefill(**x, workspace=workspace, out=o)
    try:
        with torch.cuda.graph(second):
            prefill(**x, workspace=workspace, out=o)
    except ValueError as err:
        assert "owned by graph capture" in str(err), f"refused for another reason: {err}"
    else:
        raise AssertionError("a second capture reused the workspace without an error")
