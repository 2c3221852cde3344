"""Every bad input to kdactl.kda.prefill raises ValueError naming the argument (CPU tensors, so
require_cuda=False lets each rule be reached without a GPU)."""

import pytest
import torch

from kdactl.kda import KdaProblem, validate
from tests.kda_inputs import cu_seqlens_of, make_inputs


def _call(x, scale=None, initial_state=None, cu_seqlens=None):
    return validate(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, initial_state, cu_seqlens, require_cuda=False)


def test_valid_fixed_and_varlen():
    x, s0 = make_inputs(2, 9, 3, state_n=2)
    assert _call(x, initial_state=s0) == KdaProblem(2, 9, 3, 128, 128, 2, False, 0, 0)
    x, s0 = make_inputs(1, 9, 3, K=64, V=64, state_n=3, g_dtype=torch.bfloat16, beta_dtype=torch.bfloat16)
    p = _call(x, initial_state=s0, cu_seqlens=cu_seqlens_of([4, 0, 5], dtype=torch.int64))
    assert (p.num_seqs, p.varlen, p.g_dtype, p.beta_dtype, p.key_dim, p.qkv_fp16) == (3, True, 1, 1, 64, False)
    half = {n: t.half() for n, t in x.items()}  # q, k, v and also g and beta in fp16
    assert (_call(half).qkv_fp16, _call(half).g_dtype, _call(half).beta_dtype) == (True, 2, 2)


def _mutate(name, fn):
    x, _ = make_inputs(1, 8, 2)
    x[name] = fn(x[name])
    return x


BAD = {
    "q-dtype": (lambda: _mutate("q", lambda t: t.float()), "q must be bfloat16 or float16, got float32"),
    "k-dtype": (lambda: _mutate("k", lambda t: t.half()), "k must be bfloat16, got float16"),
    "v-dtype": (lambda: _mutate("v", lambda t: t.float()), "v must be bfloat16"),
    "v-mixed": (lambda: _mutate("v", lambda t: t.half()), "v must be bfloat16, got float16"),
    "g-dtype": (lambda: _mutate("g", lambda t: t.double()), "g must be float32, bfloat16 or float16, got float64"),
    "beta-dtype": (lambda: _mutate("beta", lambda t: t.double()), "beta must be float32, bfloat16 or float16"),
    "q-ndim": (lambda: _mutate("q", lambda t: t[0]), "q must have 4 dimensions"),
    "k-shape": (lambda: _mutate("k", lambda t: t[:, :4]), "k must have shape (1, 8, 2, 128)"),
    "g-shape": (lambda: _mutate("g", lambda t: t[..., :64].contiguous()), "g must have shape"),
    "beta-shape": (lambda: _mutate("beta", lambda t: t[:, :, :1].contiguous()), "beta must have shape (1, 8, 2)"),
    "v-heads": (lambda: _mutate("v", lambda t: t[:, :, :1].contiguous()), "v heads must be a multiple of q's 2 heads"),
    "v-batch": (lambda: _mutate("v", lambda t: t[:, :4].contiguous()), "v must have shape (1, 8, 2, 128)"),
    "g-gva": (lambda: _mutate("v", lambda t: t.repeat(1, 1, 2, 1)), "g must have shape (1, 8, 4, 128)"),
    "k-contig": (lambda: _mutate("k", lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)), "k must be contiguous"),
    "q-type": (lambda: _mutate("q", lambda t: t.tolist()), "q must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_tensor_named(case):
    make, message = BAD[case]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _call(make())


@pytest.mark.parametrize(
    "K,V,arg", [(32, 128, "q"), (128, 96, "v"), (256, 128, "q")], ids=["K32", "V96", "K256"]
)
def test_unsupported_head_dims(K, V, arg):
    x, _ = make_inputs(1, 4, 1, K=K, V=V)
    with pytest.raises(ValueError, match=f"kda.prefill: {arg} head dim"):
        _call(x)


def test_cuda_required_by_default():
    x, _ = make_inputs(1, 4, 1)
    with pytest.raises(ValueError, match="q must be on a CUDA device, got cpu"):
        validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, None)


@pytest.mark.parametrize(
    "cu,B,message",
    [
        (torch.tensor([0, 3, 8], dtype=torch.float32), 1, "cu_seqlens must be an int32 or int64 tensor"),
        (torch.tensor([0], dtype=torch.int32), 1, "cu_seqlens must be 1-D with N\\+1 >= 2"),
        (torch.tensor([[0, 8]], dtype=torch.int32), 1, "cu_seqlens must be 1-D"),
        (torch.tensor([1, 3, 8], dtype=torch.int32), 1, "cu_seqlens must start at 0, got 1"),
        (torch.tensor([0, 3, 7], dtype=torch.int64), 1, "cu_seqlens must end at T=8, got 7"),
        (torch.tensor([0, 5, 3, 8], dtype=torch.int32), 1, "non-decreasing, got 5 then 3 at index 1"),
        (torch.tensor([0, 3, 8], dtype=torch.int32), 2, "batch must be 1 when cu_seqlens is given"),
    ],
    ids=["float", "short", "2d", "start", "end", "decreasing", "B2"],
)
def test_bad_cu_seqlens(cu, B, message):
    x, _ = make_inputs(B, 8, 2)
    with pytest.raises(ValueError, match=message):
        _call(x, cu_seqlens=cu)


@pytest.mark.parametrize(
    "state,message",
    [
        (torch.zeros(2, 2, 128, 128), "initial_state must have shape \\(3, 2, 128, 128\\)"),
        (torch.zeros(3, 2, 128, 128, dtype=torch.bfloat16), "initial_state must be float32, got bfloat16"),
        (torch.zeros(3, 2, 128, 64), "initial_state must have shape"),
        (torch.zeros(3, 2, 128, 256)[..., :128], "initial_state must be contiguous"),
    ],
    ids=["count", "dtype", "shape", "contiguous"],
)
def test_bad_initial_state(state, message):
    x, _ = make_inputs(1, 8, 2)
    with pytest.raises(ValueError, match=message):
        _call(x, initial_state=state, cu_seqlens=cu_seqlens_of([3, 0, 5]))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1"], ids=["nan", "inf", "str"])
def test_bad_scale(scale):
    x, _ = make_inputs(1, 4, 1)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        _call(x, scale=scale)


class _Unreadable(torch.Tensor):
    """A cu_seqlens whose values must not be read: reading a CUDA tensor back synchronizes."""

    def tolist(self):
        raise AssertionError("cu_seqlens was read back: that synchronizes the device")


def _varlen(lengths):
    x, _ = make_inputs(1, sum(lengths), 2)
    return x, cu_seqlens_of(lengths, dtype=torch.int32).as_subclass(_Unreadable)


@pytest.mark.parametrize("host", [[0, 3, 3, 8], torch.tensor([0, 3, 3, 8], dtype=torch.int64)], ids=["list", "tensor"])
def test_a_host_copy_of_cu_seqlens_is_checked_instead_of_the_device_tensor(host):
    x, cu = _varlen([3, 0, 5])
    p = validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, cu, cu_seqlens_cpu=host, require_cuda=False)
    assert p.num_seqs == 3


@pytest.mark.parametrize("host, match", [
    ([0, 3, 2, 8], "cu_seqlens must be non-decreasing, got 3 then 2 at index 1"),
    ([1, 3, 3, 8], "cu_seqlens must start at 0, got 1"),
    ([0, 3, 3, 7], "cu_seqlens must end at T=8, got 7"),
    ([0, 3, 8], "cu_seqlens_cpu must have 4 entries like cu_seqlens, got 3"),
    ([0, 3.0, 3, 8], "cu_seqlens_cpu must be a list of ints"),
    (torch.tensor([0, 3, 3, 8], dtype=torch.float32), "cu_seqlens_cpu must be a 1-D int32/int64 CPU tensor"),
])  # fmt: skip
def test_a_bad_host_copy_is_a_value_error_naming_it(host, match):
    x, cu = _varlen([3, 0, 5])
    with pytest.raises(ValueError, match=match):
        validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, cu, cu_seqlens_cpu=host, require_cuda=False)


def test_a_host_copy_without_cu_seqlens_is_refused():
    x, _ = make_inputs(1, 8, 2)
    with pytest.raises(ValueError, match="cu_seqlens_cpu is given without cu_seqlens"):
        validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, None, cu_seqlens_cpu=[0, 8], require_cuda=False)


# --- the serving state pool ----------------------------------------------------------------------


def _pool_problem():
    from kdactl.kda.validation import validate

    x, _ = make_inputs(3, 8, 2)
    return validate(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, None, require_cuda=False)


@pytest.mark.parametrize("pool, idx, match", [
    (torch.zeros(4, 2, 128, 128), None, "state_indices is needed with the other"),
    (None, torch.zeros(3, dtype=torch.int32), "state_pool is needed with the other"),
    (torch.zeros(4, 2, 128, 128, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.int32), "state_pool must be float32"),
    (torch.zeros(4, 3, 128, 128), torch.zeros(3, dtype=torch.int32), r"state_pool must have shape \(P, 2, 128, 128\)"),
    (torch.zeros(4, 2, 128, 128), torch.zeros(3, dtype=torch.int64), "state_indices must be int32"),
    (torch.zeros(4, 2, 128, 128), torch.zeros(2, dtype=torch.int32), r"one slot per sequence \(3\), got 2"),
])  # fmt: skip
def test_state_pool_arguments_are_checked(pool, idx, match):
    from kdactl.kda.validation import validate_pool

    with pytest.raises(ValueError, match=match):
        validate_pool(pool, idx, _pool_problem(), torch.device("cpu"), require_cuda=False)


def test_a_good_state_pool_passes():
    from kdactl.kda.validation import validate_pool

    validate_pool(torch.zeros(9, 2, 128, 128), torch.tensor([4, -1, 0], dtype=torch.int32), _pool_problem(),
                  torch.device("cpu"), require_cuda=False)  # fmt: skip


# --- state layout and prefix checkpoints ---------------------------------------------------------


def test_v_first_states_are_checked_in_their_own_layout():
    from kdactl.kda.validation import validate_pool

    x, _ = make_inputs(2, 8, 2, K=64, V=128)
    v_first = torch.zeros(2, 2, 128, 64)
    p = validate(**x, scale=None, initial_state=v_first, cu_seqlens=None, require_cuda=False, state_v_first=True)
    assert p.state_v_first and p.state_shape == (128, 64)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 2, 64, 128\)"):
        _call(x, initial_state=v_first)  # K-first by default
    with pytest.raises(ValueError, match=r"state_pool must have shape \(P, 2, 128, 64\)"):
        validate_pool(torch.zeros(4, 2, 64, 128), torch.zeros(2, dtype=torch.int32), p, torch.device("cpu"),
                      require_cuda=False)  # fmt: skip


def _checkpoints(x, every, buffer=None, cu=None, cu_cpu=None, dtype=None, v_first=False):
    from kdactl.kda.validation import validate_checkpoints

    p = validate(**x, scale=None, initial_state=None, cu_seqlens=cu, require_cuda=False, state_v_first=v_first)
    return validate_checkpoints(every, buffer, p, torch.device("cpu"), cu, cu_cpu, dtype=dtype, require_cuda=False)


def test_checkpoints_are_allocated_in_fla_layout():
    x, _ = make_inputs(2, 40, 3, K=64, V=128)
    c = _checkpoints(x, 16)
    assert c.shape == (2, 3, 3, 64, 128) and c.dtype == torch.float32  # ceil(40 / 16) = 3 per sequence
    assert _checkpoints(x, 32, dtype=torch.bfloat16, v_first=True).shape == (2, 2, 3, 128, 64)
    x, _ = make_inputs(1, 100, 3, K=64, V=64)
    cu = cu_seqlens_of([17, 0, 16, 67])  # 2 + 0 + 1 + 5 rows at every 16
    assert _checkpoints(x, 16, cu=cu).shape == (1, 8, 3, 64, 64)
    assert _checkpoints(x, 16, cu=cu, cu_cpu=[0, 17, 17, 33, 100]).shape == (1, 8, 3, 64, 64)


@pytest.mark.parametrize("every, buffer, dtype, match", [
    (24, None, None, "checkpoint_every must be a positive multiple of 16 tokens, got 24"),
    (0, None, None, "checkpoint_every must be a positive multiple of 16"),
    (True, None, None, "checkpoint_every must be a positive multiple of 16"),
    (None, torch.zeros(2, 3, 3, 64, 128), None, "checkpoint_every must be"),
    (16, None, torch.float16, "checkpoint_dtype must be float32 or bfloat16"),
    (16, torch.zeros(2, 3, 3, 64, 128), torch.float32, "checkpoint_dtype must be .* only without a checkpoints buffer"),
    (16, torch.zeros(2, 2, 3, 64, 128), None, r"checkpoints must have shape \(2, 3, 3, 64, 128\)"),
    (16, torch.zeros(2, 3, 3, 64, 128, dtype=torch.float16), None, "checkpoints must be float32 or bfloat16"),
    (16, torch.zeros(6, 3, 64, 128), None, "checkpoints must have 5 dimensions"),
])  # fmt: skip
def test_bad_checkpoints_are_named(every, buffer, dtype, match):
    x, _ = make_inputs(2, 40, 3, K=64, V=128)
    with pytest.raises(ValueError, match=match):
        _checkpoints(x, every, buffer, dtype=dtype)


def test_a_varlen_buffer_may_have_spare_rows_but_not_too_few():
    x, _ = make_inputs(1, 100, 3, K=64, V=64)
    cu, cu_cpu = cu_seqlens_of([17, 0, 16, 67]), [0, 17, 17, 33, 100]
    spare = torch.zeros(1, 20, 3, 64, 64)
    assert _checkpoints(x, 16, spare, cu=cu, cu_cpu=cu_cpu) is spare
    with pytest.raises(ValueError, match="checkpoints has 7 rows, these sequences need 8"):
        _checkpoints(x, 16, torch.zeros(1, 7, 3, 64, 64), cu=cu, cu_cpu=cu_cpu)
