"""csrc's kernels run on the CPU by the emulator (tests/emu), against the fp64 reference: every route,
the fused transforms (both gates, l2norm, beta's sigmoid, V-first states), fp16, K = 64, grouped
q/k heads, varlen tails of 1-15 tokens, state pools, and small_bh cut into several segments (an
emulated SM count makes its plan cut short sequences). The same limit as the GPU tests (SPEC 5e-3).

The GPU remains the judge of speed and of what only hardware shows (timing, the real tensor cores'
summation order, races between warps without a barrier); these tests catch a kernel that computes
the wrong thing before a GPU visit does, and (run with the threads between barriers in other orders)
a kernel whose result depends on that order: a race. Two planted faults check that they can: a
wrong operand layout and a missing __syncwarp each fail them."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from kdactl.bench import configs
from kdactl.kda.fused import Fused
from kdactl.kda.inputs import cu_seqlens_of, random_inputs
from kdactl.kda.problem import KdaProblem
from kdactl.kda.routes import DeviceInfo, small_bh_plan
from kdactl.kda.tuning import Tuning
from kdactl.kernel_abi import SMALL_BH_MAX_UNSTITCHED
from kdactl.reference import ERROR_LIMIT, error_ratio, fused_inputs, kda_recurrent
from tests.emu.build import build, cuda_includes
from tests.emu.kernels import EVERY_ORDER, FORWARD, REVERSE, SMALL_SMEM_OPTIN, EmulatedKernels
from tests.kda_inputs import (
    EDGE_CASES,
    bend_to_edge,
    carried_history_inputs,
    fla_gate_case,
    gate_error,
    gate_sweep,
    raw_inputs,
)

LOWER_BOUND, SOFTPLUS = configs.LOWER_BOUND.fused_spec(), configs.SOFTPLUS.fused_spec()  # the bench's configurations
FEW_SMS = 16  # small_bh cuts a 1000-token sequence of 2 heads into several segments


@pytest.fixture(scope="module")
def includes(nvcc_toolkit):
    return cuda_includes(nvcc_toolkit.nvcc)


@pytest.fixture(scope="module")
def library(includes, tmp_path_factory):
    from kdactl.assets import csrc_dir

    return build(csrc_dir(), includes, tmp_path_factory.mktemp("emu"))


@pytest.fixture(scope="module")
def kernels(library):
    """EmulatedKernels by SM count and schedule, one library copy each."""
    made: dict[tuple[int, int], EmulatedKernels] = {}

    def of(sms: int = 132, schedule: int = FORWARD) -> EmulatedKernels:
        if (sms, schedule) not in made:
            made[sms, schedule] = EmulatedKernels(library, sms, schedule)
        return made[sms, schedule]

    return of


def errors(kernels, route, x, *, sms=132, fused=None, A_log=None, dt_bias=None, initial_state=None,
           cu_seqlens=None, state_v_first=False, state_indices=None):  # fmt: skip
    """(o, final state) error ratios of one emulated call against fp64 kda_recurrent."""
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    q, k, g, beta = fused_inputs(q, k, v, g, beta, fused or Fused(), A_log, dt_bias)  # grouped q/k heads repeated
    ref_init = initial_state
    if initial_state is not None and state_indices is not None:
        ref_init = initial_state[state_indices.long()]
    if ref_init is not None and state_v_first:
        ref_init = ref_init.transpose(-1, -2)
    ref_o, ref_s = kda_recurrent(q, k, v, g, beta, initial_state=ref_init, cu_seqlens=cu_seqlens)
    if state_v_first:
        ref_s = ref_s.transpose(-1, -2)
    o, s = kernels(sms).run(route, x["q"], x["k"], x["v"], x["g"], x["beta"], fused=fused or Fused(), A_log=A_log,
                            dt_bias=dt_bias, initial_state=None if initial_state is None else initial_state.clone(),
                            cu_seqlens=cu_seqlens, state_v_first=state_v_first, state_indices=state_indices)  # fmt: skip
    if state_indices is not None:
        s = s[state_indices.long()]
    return error_ratio(ref_o, o), error_ratio(ref_s, s)


def segments(T, H, sms, K=128):
    return small_bh_plan(KdaProblem(1, T, H, K, K, 1, False, 0, 0), DeviceInfo(sms, (9, 0), "sm_90a")).segments


@pytest.mark.parametrize(("route", "T"), [("direct", 72), ("chunk", 1000), ("small_bh", 1000)])
def test_plain_routes_match_the_reference(kernels, route, T):
    x, s0, _ = random_inputs(1, T, 2, with_state=True, g_range=(-0.02, 0.0))  # weak decay: the history matters
    assert max(errors(kernels, route, x, sms=FEW_SMS, initial_state=s0)) < ERROR_LIMIT


@pytest.mark.parametrize("gates,all_warm", [("warm", 1), ("slow", 1), ("cold", 0), ("warm-then-cold", 0)])
def test_small_bh_runs_unstitched_segments_at_once_only_where_all_start_warm(kernels, gates, all_warm):
    """A fixed layout of at most SMALL_BH_MAX_UNSTITCHED segments is not stitched: a kernel finds whether
    every segment starts warm (its answer is the workspace's last word), and then the segments run at
    once, or else route chunk's walks of whole sequences. 3000 tokens: segments of 47 chunks, so that a
    start past the first walks back WARM_CHUNKS without reaching the sequence's start. "slow": every start
    warm only about 23 chunks back (g in [-0.4, 0]), past warm_start_at's first rounds of bounds."""
    from kdactl.kda.segments import WARM_CHUNKS

    count = segments(3000, 4, FEW_SMS)
    assert 2 <= count <= SMALL_BH_MAX_UNSTITCHED and 3000 // 16 // count > WARM_CHUNKS
    g_range = {"cold": (-0.02, 0.0), "slow": (-0.4, 0.0)}.get(gates, (-8.0, 0.0))
    x, s0, _ = random_inputs(1, 3000, 4, with_state=True, g_range=g_range)
    if gates == "warm-then-cold":
        x["g"][:, 1500:] *= 1e-3
    emu = kernels(FEW_SMS)
    assert max(errors(lambda *_: emu, "small_bh", x, initial_state=s0)) < ERROR_LIMIT
    assert int(emu.workspace[-4:].view(torch.int32)) == all_warm


@pytest.mark.parametrize("sms", [FEW_SMS, FEW_SMS // 2])
def test_small_bh_stitches_several_segments(kernels, sms):
    """The stitch's 16 CTAs (8 value columns each, 2 heads) fit 16 SMs once: two M^T buffers; on 8 SMs
    they would take two waves, and one buffer lets them share SMs instead."""
    assert segments(1000, 2, sms, K=64) > SMALL_BH_MAX_UNSTITCHED
    x, s0, _ = random_inputs(1, 1000, 2, K=64, V=64, with_state=True, g_range=(-0.02, 0.0))
    assert max(errors(kernels, "small_bh", x, sms=sms, initial_state=s0)) < ERROR_LIMIT


@pytest.mark.parametrize("route", ["chunk", "small_bh"])
@pytest.mark.parametrize("draw", ["init", "flashkda"])
def test_lower_bound_configuration(kernels, route, draw):
    """Kimi-K3's call: l2norm, beta sigmoid, the lower-bound gate from raw logits, V-first state."""
    x, A_log, dt_bias = raw_inputs(1000, 2, draw)
    err = errors(kernels, route, x, sms=FEW_SMS, fused=LOWER_BOUND, A_log=A_log, dt_bias=dt_bias, state_v_first=True)
    assert max(err) < ERROR_LIMIT


@pytest.mark.parametrize(("route", "T"), [("direct", 64), ("chunk", 512)])
@pytest.mark.parametrize("gate", ["softplus", "bound"])
def test_gate_precision(kernels, route, T, gate):
    """The in-kernel gate against the fp64 one over every region of both gates (tests.kda_inputs
    gate_sweep), with the MUFU ops exact here: what is left is the gate's own formula (softplus's
    minimax cubic, relative error 2^-22.4: csrc/device.cuh log1p_exp_neg) and fp32's roundings, a few
    2^-24 of each gate and of each step's product with the state; the GPU's test adds ex2's 2^-22."""
    kwargs, G_true = gate_sweep(T, gate)
    _, s = kernels().run(route, **kwargs)
    worst, _ = gate_error(s, G_true, route, T, per_step=2.0**-22, per_nat=2.0**-20)
    assert worst <= 1.0, f"gate error past its bound: {worst:.2f}x"


@pytest.mark.parametrize("fp16", [False, True])
def test_softplus_configuration_with_fla_draw(kernels, fp16):
    """Kimi-Linear's call with fla's test draw of the gate parameters: steep chunks."""
    x, A_log, dt_bias = raw_inputs(1000, 2, "test", fp16=fp16)
    assert max(errors(kernels, "chunk", x, fused=SOFTPLUS, A_log=A_log, dt_bias=dt_bias)) < ERROR_LIMIT


def test_grouped_qk_heads(kernels):
    x, s0, _ = random_inputs(1, 300, 4, with_state=True)
    x.update(q=x["q"][:, :, :2].contiguous(), k=x["k"][:, :, :2].contiguous())  # 2 q/k heads for 4 value heads
    assert max(errors(kernels, "chunk", x, initial_state=s0)) < ERROR_LIMIT


def test_varlen_tails(kernels):
    lengths = [33, 1, 64, 15, 0, 200]
    x, s0, cu = random_inputs(1, 0, 2, lengths=lengths, with_state=True)
    assert max(errors(kernels, "chunk", x, initial_state=s0, cu_seqlens=cu)) < ERROR_LIMIT


@pytest.mark.parametrize("route", ["chunk", "small_bh"])
def test_state_pool(kernels, route):
    x, _, _ = random_inputs(2, 500, 2, g_range=(-0.02, 0.0))
    pool = torch.randn(6, 2, 128, 128, generator=torch.Generator().manual_seed(3)) * 0.5
    slots = torch.tensor([4, 1], dtype=torch.int32)
    assert max(errors(kernels, route, x, sms=FEW_SMS, initial_state=pool, state_indices=slots)) < ERROR_LIMIT
    untouched = pool[[0, 2, 3, 5]]
    o, after = kernels(FEW_SMS).run(route, x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=pool.clone(),
                                    state_indices=slots)  # fmt: skip
    assert torch.equal(after[[0, 2, 3, 5]], untouched)  # slots no sequence names are left as they were


@pytest.mark.parametrize("route", ["direct", "chunk"])
def test_v_first_pool_with_a_sequence_without_state(kernels, route):
    """Slot -1: the sequence starts from zero and its end state goes nowhere; the pool's other slots stay."""
    lengths = (40, 7, 100) if route == "chunk" else (20, 7, 30)
    x, _, cu = random_inputs(1, 0, 2, lengths=lengths, seed=9)
    pool = torch.randn(5, 2, 128, 128, generator=torch.Generator().manual_seed(5)) * 0.5  # V-first: [V, K]
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    starts = torch.stack([pool[3], torch.zeros(2, 128, 128), pool[0]]).transpose(-1, -2)  # as [K, V]
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    ref_o, ref_s = kda_recurrent(q, k, v, g, beta, initial_state=starts, cu_seqlens=cu)
    after = pool.clone()
    o, _ = kernels().run(route, q, k, v, g, beta, initial_state=after, cu_seqlens=cu, state_v_first=True,
                         state_indices=slots)  # fmt: skip
    assert error_ratio(ref_o, o) < ERROR_LIMIT
    assert error_ratio(ref_s[[0, 2]], after[[3, 0]].transpose(-1, -2)) < ERROR_LIMIT
    assert torch.equal(after[[1, 2, 4]], pool[[1, 2, 4]])


def test_varlen_lower_bound_configuration(kernels):
    lengths = [300, 17, 600, 83]
    x, A_log, dt_bias = raw_inputs(0, 2, "init", lengths=lengths)
    err = errors(
        kernels, "chunk", x, fused=LOWER_BOUND, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens_of(lengths)
    )
    assert max(err) < ERROR_LIMIT


@pytest.mark.parametrize(("warps", "stages"), [(2, 4), (2, 8), (4, 4), (4, 8), (8, 4)])
def test_every_recurrence_shape_the_chunk_route_builds(kernels, warps, stages):
    x, s0, _ = random_inputs(2, 300, 2, with_state=True, g_range=(-0.05, 0.0))
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    ref_o, ref_s = kda_recurrent(q, k, v, g, beta, initial_state=s0)
    o, s = kernels().run("chunk", q, k, v, g, beta, initial_state=s0.clone(), tuning=Tuning(warps=warps, stages=stages))
    assert max(error_ratio(ref_o, o), error_ratio(ref_s, s)) < ERROR_LIMIT


@pytest.mark.parametrize("route", ["chunk", "small_bh"])
def test_a_device_with_99_kb_of_shared_memory_per_block(library, route):
    """sm_86/89/120 parts: the chunk route's 8-stage ring falls back to 4 stages (a launch past the
    device's shared memory fails in the emulator as on the GPU); small_bh's planned shape fits."""
    small = EmulatedKernels(library, FEW_SMS, smem_optin=SMALL_SMEM_OPTIN)
    x, s0, _ = random_inputs(1, 300, 2, with_state=True, g_range=(-0.05, 0.0))
    assert max(errors(lambda *_: small, route, x, initial_state=s0)) < ERROR_LIMIT


def test_varlen_walks_longest_first_when_they_outnumber_the_sms(kernels):
    x, s0, cu = random_inputs(1, 0, 2, lengths=[40, 300, 5, 129, 77], with_state=True, cu_dtype=torch.int64)
    assert max(errors(kernels, "chunk", x, sms=2, initial_state=s0, cu_seqlens=cu)) < ERROR_LIMIT


@pytest.mark.parametrize(
    ("route", "lengths", "every", "dtype", "v_first"),
    [("chunk", None, 32, torch.float32, False), ("chunk", [40, 7, 100], 48, torch.bfloat16, True),
     ("direct", None, 16, torch.float32, True)],
)  # fmt: skip
def test_checkpoints(kernels, route, lengths, every, dtype, v_first):
    """Prefix checkpoints: every sequence's state before tokens 0, C, 2C, ... (fp32 or bf16, K- or V-first)."""
    x, s0, cu = random_inputs(2, 40 if route == "direct" else 100, 2, lengths=lengths, with_state=True)
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    ref_o, ref_s, ref_c = kda_recurrent(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, checkpoint_every=every)
    init = s0.transpose(-1, -2).contiguous() if v_first else s0
    o, s, c = kernels().run(route, q, k, v, g, beta, initial_state=init, cu_seqlens=cu, state_v_first=v_first,
                            checkpoint_every=every, checkpoint_dtype=dtype)  # fmt: skip
    assert c.dtype == dtype and c.shape[0] == ref_c.shape[0]
    if v_first:
        c, s = c.transpose(-1, -2), s.transpose(-1, -2)
    assert max(error_ratio(ref_o, o), error_ratio(ref_s, s), error_ratio(ref_c, c)) < ERROR_LIMIT


# --- the cases that broke other kernels (tests/test_kda_fused_gpu.py runs them on the GPU) -----------


def edge_inputs(case, T, seed):
    """fla's raw draw bent into one edge case (tests/kda_inputs.py bend_to_edge), and its config."""
    x, A_log, dt_bias = raw_inputs(T, 2, "test", seed=seed)
    x["g"] = x["g"].float()
    return x, A_log, dt_bias, {"softplus": SOFTPLUS, "bound": LOWER_BOUND}[bend_to_edge(case, x, A_log, dt_bias)]


@pytest.mark.parametrize("route", ["direct", "chunk", "small_bh"])
@pytest.mark.parametrize("case", EDGE_CASES)
def test_precision_edges(kernels, route, case):
    T = {"direct": 48, "chunk": 300, "small_bh": 1000}[route]
    x, A_log, dt_bias, fused = edge_inputs(case, T, seed=len(case))
    s0 = torch.randn(1, 2, 128, 128, generator=torch.Generator().manual_seed(1)) * 0.5
    err = errors(kernels, route, x, sms=FEW_SMS, fused=fused, A_log=A_log, dt_bias=dt_bias, initial_state=s0)
    assert max(err) < ERROR_LIMIT


@pytest.mark.parametrize("fused", [LOWER_BOUND, SOFTPLUS], ids=["bound", "softplus"])
def test_tails_of_1_to_15_tokens(kernels, fused):
    """Sequences of 16 c + r tokens, r = 1 .. 15: every partial last chunk, with a start state."""
    lengths = [16 * (r % 3) + r for r in range(1, 16)]
    x, A_log, dt_bias = raw_inputs(0, 2, "test", lengths=lengths)
    s0 = torch.randn(len(lengths), 2, 128, 128, generator=torch.Generator().manual_seed(2)) * 0.5
    err = errors(kernels, "chunk", x, fused=fused, A_log=A_log, dt_bias=dt_bias, initial_state=s0,
                 cu_seqlens=cu_seqlens_of(lengths))  # fmt: skip
    assert max(err) < ERROR_LIMIT


@pytest.mark.parametrize("decay", [59.0, 61.0])
def test_shifted_reference_at_its_limit(kernels, decay):
    """A log decay whose last 8 tokens of a chunk sum to -59 (e^+-59 on the tensor cores) and to -61
    (past kShiftLimit: the steep path)."""
    x, s0, _ = random_inputs(1, 256, 2, with_state=True)
    x["g"].fill_(-decay / 8)
    assert max(errors(kernels, "chunk", x, initial_state=s0)) < ERROR_LIMIT


def steep_tail_inputs(bound=False):
    """(x, kwargs for errors) of chunks whose first 8 tokens keep everything (softplus and sigmoid of -30
    are ~1e-13) and whose last 8 forget 100 nats (softplus(12.5) = 12.5 a token; or lb = -12.5 with
    sigmoid(30) = 1), where the fast path's e^-G' would overflow fp32."""
    T, H = 256, 2
    x, s0, _ = random_inputs(1, T, H, with_state=True)
    last_half = (torch.arange(T) % 16 >= 8)[None, :, None, None]
    x["g"] = torch.where(last_half, 30.0 if bound else 12.5, -30.0).expand(1, T, H, 128).contiguous()
    fused = dataclasses.replace(LOWER_BOUND, lower_bound=-12.5) if bound else SOFTPLUS
    return x, dict(fused=fused, A_log=torch.zeros(H), dt_bias=torch.zeros(H * 128), initial_state=s0)  # A = 1


def test_the_library_refuses_a_lower_bound_gate_that_is_not_a_decay(kernels):
    """The prepare checks only the last row of a chunk whose gates decay (lower_bound < 0): the C ABI refuses a
    lower_bound that is not negative, as kdactl.kda.Fused does, so an outside caller cannot pass one by."""
    x, kwargs = steep_tail_inputs(bound=True)
    object.__setattr__(kwargs["fused"], "lower_bound", 0.5)  # past Fused's own check
    with pytest.raises(RuntimeError, match="negative lower_bound"):
        kernels(FEW_SMS).run("chunk", **x, **kwargs)


@pytest.mark.parametrize("bound", [False, True], ids=["softplus", "bound"])
def test_fla_gates_steep_over_the_last_half_of_a_chunk(kernels, bound):
    """fla's gates only decay, so the prepare checks their chunks' G against kShiftLimit at the reference
    row and the last row alone: a chunk that decays steeply after its reference row takes the steep path."""
    x, kwargs = steep_tail_inputs(bound)
    assert max(errors(kernels, "chunk", x, **kwargs)) < ERROR_LIMIT


@pytest.mark.parametrize("norm_log2", [39.9, 44.0])
def test_l2norm_folded_up_to_its_limit(kernels, norm_log2):
    """q and k rows of norm 2^39.9, whose l2norm the prepare folds into its products (operands up to
    |x| e^59 on the tensor cores), and of norm 2^44, past kFoldL2Max, where folded operands would
    overflow fp32 and the tiles are normalized in place; under a decay of e^59 across half a chunk."""
    x, s0, _ = random_inputs(1, 256, 2, with_state=True)
    x["g"].fill_(-59.0 / 8)
    for n in ("q", "k"):
        x[n] = (torch.nn.functional.normalize(x[n].float(), dim=-1) * 2.0**norm_log2).to(x[n].dtype)
    assert max(errors(kernels, "chunk", x, fused=Fused(qk_l2norm=True), initial_state=s0)) < ERROR_LIMIT


@pytest.mark.parametrize("sms", [4, FEW_SMS])
def test_small_bh_varlen_units(kernels, sms):
    """small_bh on a varlen batch: long sequences cut into units, short and empty ones whole."""
    lengths = [300, 17, 600, 0, 83]
    x, s0, cu = random_inputs(1, 0, 2, lengths=lengths, with_state=True, g_range=(-0.02, 0.0))
    assert max(errors(kernels, "small_bh", x, sms=sms, initial_state=s0, cu_seqlens=cu)) < ERROR_LIMIT


def test_small_bh_varlen_lower_bound_configuration(kernels):
    lengths = [300, 17, 600, 83]
    x, A_log, dt_bias = raw_inputs(0, 2, "flashkda", lengths=lengths)
    err = errors(kernels, "small_bh", x, sms=FEW_SMS, fused=LOWER_BOUND, A_log=A_log, dt_bias=dt_bias,
                 cu_seqlens=cu_seqlens_of(lengths), state_v_first=True)  # fmt: skip
    assert max(err) < ERROR_LIMIT


def test_small_bh_fp16_softplus(kernels):
    x, A_log, dt_bias = raw_inputs(1000, 2, "test", fp16=True)
    assert max(errors(kernels, "small_bh", x, sms=FEW_SMS, fused=SOFTPLUS, A_log=A_log, dt_bias=dt_bias)) < ERROR_LIMIT


@pytest.mark.parametrize("route", ["direct", "chunk", "small_bh"])
def test_no_result_depends_on_the_order_of_threads(kernels, route):
    """Bitwise the same outputs whatever order the threads run in between barriers (lower-bound
    configuration, V-first; small_bh cut into segments): no thread reads what another may not have
    written yet or may already have overwritten."""
    x, A_log, dt_bias = raw_inputs(72 if route == "direct" else 300, 2, "init")
    call = dict(fused=LOWER_BOUND, A_log=A_log, dt_bias=dt_bias, state_v_first=True)
    runs = [kernels(FEW_SMS, schedule).run(route, **x, **call) for schedule in EVERY_ORDER]
    for o, state in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(state, runs[0][1])


def test_fp16_final_state_within_flas_tolerance(kernels):
    """fla's fp16 softplus-gate draw with grouped values (tools/emulate.py --fla-gate-case): fla holds
    o to 2e-3; the fp16 operands of the state update keep the final state within 1e-3 (bf16: 2.4e-3)."""
    x, h0, fused, A_log, _, scale = fla_gate_case()
    q, k, g, beta = fused_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], fused, A_log)
    ref_o, ref_s = kda_recurrent(q, k, x["v"], g, beta, scale=scale, initial_state=h0)
    o, s = kernels().run("chunk", **x, scale=scale, fused=fused, A_log=A_log, initial_state=h0.clone())
    assert error_ratio(ref_o, o) <= 2e-3 and error_ratio(ref_s, s) <= 1e-3


def test_small_bh_keeps_history_a_bound_per_channel_would_drop(kernels):
    """carried_history_inputs: each chunk decays every key channel by e^-40 and still keeps a quarter
    of the state; a warm start taken on a bound per channel would drop that history and miss o."""
    assert segments(1000, 2, FEW_SMS) >= 4
    x = carried_history_inputs(1000, H=2)
    s0 = torch.randn(1, 2, 128, 128, generator=torch.Generator().manual_seed(4))
    assert max(errors(kernels, "small_bh", x, sms=FEW_SMS, initial_state=s0)) < ERROR_LIMIT


def test_small_bh_varlen_and_pool_do_not_depend_on_the_order_of_threads(kernels):
    """The branch's small_bh layouts (varlen units with warm starts, a state pool) under three schedules."""
    lengths = [300, 17, 600, 83]
    x, A_log, dt_bias = raw_inputs(0, 2, "flashkda", lengths=lengths)
    varlen = dict(x, fused=LOWER_BOUND, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens_of(lengths))
    x, _, _ = random_inputs(2, 500, 2, g_range=(-0.02, 0.0))
    pool = torch.randn(6, 2, 128, 128, generator=torch.Generator().manual_seed(3)) * 0.5
    pooled = dict(x, state_indices=torch.tensor([4, 1], dtype=torch.int32))
    for call, start in ((varlen, None), (pooled, pool)):
        runs = [kernels(FEW_SMS, schedule).run("small_bh", **call, initial_state=None if start is None else start.clone())
                for schedule in EVERY_ORDER]  # fmt: skip
        for o, state in runs[1:]:
            assert torch.equal(o, runs[0][0]) and torch.equal(state, runs[0][1])


# Planted faults: each, alone, must fail its check (the race shows when the lanes run in reverse
# order; in index order it happens to read nothing stale): "plain", the chunk route on a weakly
# decaying draw; "carried", small_bh on carried_history_inputs (a warm start must not drop history);
# "steep", Kimi-Linear's call with fla's draw (every chunk through steep_a_p).
FAULTS = {
    # the value tile read as if it were stored transposed
    "operand layout": ("ldmatrix_x4_trans(av, v_rows);", "ldmatrix_x4(av, v_rows);", "plain"),
    # lanes go on to overwrite N while others still read it
    "missing __syncwarp": ("__syncwarp();  // every lane has read N", "", "plain"),
    # the recurrence's ring waits for one chunk's copies too few: it reads a stage still in flight
    "ring one stage short": ("cp_async_wait<STAGES - 2>();", "cp_async_wait<STAGES - 1>();", "plain"),
    # a chunk map bounded per key channel (max eG alone), without the rank-1 terms
    "bound per channel": ("log2f((eg_max + terms) * kBoundMargin)", "log2f(eg_max * kBoundMargin)", "carried"),
    # steep_a_p without the pairs parted at level 1 of the halving
    "steep level dropped": (
        "if (lv < 4) mma_tf32(acc_a[lv < 4 ? lv : 0], ak, b0, b1);",
        "if (lv < 4 && lv != 1) mma_tf32(acc_a[lv < 4 ? lv : 0], ak, b0, b1);",
        "steep",
    ),
    # fla's gates checked against kShiftLimit at the reference row only, not at the chunk's last row
    "last row unchecked": ("if (!kFalls || r == C - 1)", "if (!kFalls)", "steep tail"),
    # the second half of a halved segment emits from one chunk past the middle: that chunk's o is lost
    "halves apart": (
        "if (m_slot) c_first = mid, warm = warm_mid, second_half = true;",
        "if (m_slot) c_first = mid + 1, warm = warm_mid, second_half = true;",
        "halves",
    ),
}
HALVES_SMS = 32  # B1 T4000 H1: 11 segments of 23 chunks (the sqrt cap), 44 reduction CTAs in 64 slots


@pytest.mark.parametrize("fault", FAULTS)
def test_a_planted_fault_fails(fault, includes, tmp_path):
    from kdactl.assets import csrc_dir

    csrc = tmp_path / "csrc"
    shutil.copytree(csrc_dir(), csrc)
    path = csrc / "kda_chunk.cuh"
    before, after, check = FAULTS[fault]
    text = path.read_text()
    assert text.count(before) == 1, f"the fault's site moved: {before!r}"
    path.write_text(text.replace(before, after))
    sms = HALVES_SMS if check == "halves" else FEW_SMS
    faulty = EmulatedKernels(build(csrc, includes, tmp_path / "lib"), sms, schedule=REVERSE)
    if check == "halves":
        x, s0, _ = random_inputs(1, 4000, 1, with_state=True, g_range=(-8.0, 0.0))
        err = errors(lambda *_: faulty, "small_bh", x, initial_state=s0)
    elif check == "steep":
        x, A_log, dt_bias = raw_inputs(1000, 2, "test")
        err = errors(lambda *_: faulty, "chunk", x, fused=SOFTPLUS, A_log=A_log, dt_bias=dt_bias)
    elif check == "steep tail":
        x, kwargs = steep_tail_inputs()
        err = errors(lambda *_: faulty, "chunk", x, **kwargs)
    elif check == "carried":
        s0 = torch.randn(1, 2, 128, 128, generator=torch.Generator().manual_seed(4))
        err = errors(lambda *_: faulty, "small_bh", carried_history_inputs(1000, H=2), initial_state=s0)
    else:
        x, s0, _ = random_inputs(1, 200, 2, with_state=True, g_range=(-0.02, 0.0))
        err = errors(lambda *_: faulty, "chunk", x, initial_state=s0)
    assert max(err) > ERROR_LIMIT


@pytest.mark.parametrize("gates", ["warm", "warm-then-cold"])
def test_small_bh_walks_a_known_segment_in_two_halves_where_its_middle_starts_warm(kernels, gates):
    """Where small_bh's reduction grid (an M slot beside every segment) fits one wave, a known segment
    whose middle chunk starts warm is walked by its E slot to the middle and by its M slot from there
    (Segments::halves); segments stitched later in the sequence keep their M slots. Both against fp64,
    with an initial state, and the halves counted by kdactl.kda.segments from the call's bounds."""
    from kdactl.kda.routes import small_bh_halves
    from kdactl.kda.segments import bounds_offset, read_log2_bounds, segment_starts

    T = 4000
    p = KdaProblem(1, T, 1, 128, 128, 1, False, 0, 0)
    emu = kernels(HALVES_SMS)
    plan = small_bh_plan(p, emu.device)
    assert plan.segments == 11 > SMALL_BH_MAX_UNSTITCHED and small_bh_halves(p, emu.device)
    x, s0, _ = random_inputs(1, T, 1, with_state=True, g_range=(-8.0, 0.0))
    if gates == "warm-then-cold":
        x["g"][:, 2000:] *= 1e-3  # segments 6.. start cold: stitched
    assert max(errors(lambda *_: emu, "small_bh", x, initial_state=s0)) < ERROR_LIMIT
    bounds = read_log2_bounds(emu.workspace, p, bounds_offset(p, emu.device, emu.workspace_bytes))
    starts = segment_starts(bounds, [T], plan.segment_chunks, halves=True)
    if gates == "warm":
        assert (starts.warm, starts.stitched, starts.halved) == (10, 0, 11), starts
    else:  # segments 0-4 end before token 2000 (chunk 125): known and halved; segment 6 (from chunk 138) walks
        # back across the cold chunks to a warm one within WARM_CHUNKS; from segment 7 on stitched
        assert starts.stitched >= 4 and 6 <= starts.halved <= 7, starts


def test_small_bh_warm_starts_that_walk_back_past_one_round_of_bounds(kernels):
    """A decay that bounds the dropped history to 2^-20 only about 23 chunks back (g in [-0.4, 0]: each
    chunk's map bounded by about 2^-0.9): every start past the first walks back through the third of
    warm_start_at's rounds of kWarmLoads bounds and starts warm (with a window of 8 chunks each would be
    stitched), against fp64 with an initial state."""
    from kdactl.kda.segments import WARM_CHUNKS, bounds_offset, read_log2_bounds, segment_starts, warm_start

    T = 4000
    p = KdaProblem(1, T, 1, 128, 128, 1, False, 0, 0)
    emu = kernels(HALVES_SMS)
    plan = small_bh_plan(p, emu.device)
    x, s0, _ = random_inputs(1, T, 1, with_state=True, g_range=(-0.4, 0.0))
    assert max(errors(lambda *_: emu, "small_bh", x, initial_state=s0)) < ERROR_LIMIT
    bounds = read_log2_bounds(emu.workspace, p, bounds_offset(p, emu.device, emu.workspace_bytes))
    firsts = range(plan.segment_chunks, -(-T // 16), plan.segment_chunks)
    starts = segment_starts(bounds, [T], plan.segment_chunks)
    assert starts.stitched == 0 and starts.warm == len(firsts), starts
    walks = [first - warm_start([b[0] for b in bounds], first) for first in firsts]
    assert 16 < max(walks) <= WARM_CHUNKS, walks


def test_small_bh_halves_do_not_depend_on_the_order_of_threads(kernels):
    x, s0, _ = random_inputs(1, 4000, 1, with_state=True, g_range=(-8.0, 0.0))
    runs = [kernels(HALVES_SMS, schedule).run("small_bh", **x, initial_state=s0.clone()) for schedule in (FORWARD, REVERSE)]
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))


@pytest.mark.parametrize("draw,warm", [("flashkda", True), ("init", False)])
def test_segment_starts_read_back_from_small_bhs_workspace(kernels, draw, warm):
    """kdactl bench's report of small_bh's starts (kdactl.kda.segments) from the bounds an emulated call
    left in its workspace: every start warm under FlashKDA's draw (every channel decays strongly), none
    under a layer's initialization (the state keeps most of itself each chunk), as tools/decay_bounds.py
    computes them in fp64."""
    from kdactl.kda.segments import WARM_CHUNKS, bounds_offset, read_log2_bounds, segment_starts

    T, H = 4000, 2  # 250 chunks: starts far more than WARM_CHUNKS from the sequence's start
    x, A_log, dt_bias = raw_inputs(T, H, draw)
    emu = kernels(FEW_SMS)
    emu.run("small_bh", x["q"], x["k"], x["v"], x["g"], x["beta"], fused=LOWER_BOUND, A_log=A_log, dt_bias=dt_bias,
            state_v_first=True)  # fmt: skip
    p = KdaProblem(1, T, H, 128, 128, 1, False, False, False)
    plan = small_bh_plan(p, emu.device)
    bounds = read_log2_bounds(emu.workspace, p, bounds_offset(p, emu.device, emu.workspace_bytes))
    starts = segment_starts(bounds, [T], plan.segment_chunks)
    later = [first for first in range(plan.segment_chunks, -(-T // 16), plan.segment_chunks) if first > WARM_CHUNKS]
    assert starts.warm + starts.stitched == H * (plan.segments - 1) and later
    assert starts.stitched == (0 if warm else H * len(later)), starts
