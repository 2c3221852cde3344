"""The SPEC target policy, row by row, plus the KDACTL_CUDA_ARCH override and target names."""

import pytest

from kdactl.errors import UnsupportedTarget, UsageError
from kdactl.jit.resolver import TargetResolver
from kdactl.targets import TARGETS, get_target, parse_target_list, select_target, target_runs_on

# (cc, cuda) -> target, one case per SPEC row and its edges.
SUPPORTED = [
    ((9, 0), (12, 0), "sm_90a"), ((9, 0), (13, 0), "sm_90a"),
    ((10, 0), (12, 8), "sm_100a"),
    ((10, 0), (12, 9), "sm_100f"), ((10, 0), (13, 0), "sm_100f"),
    ((10, 3), (12, 9), "sm_100f"), ((10, 3), (13, 0), "sm_100f"),
    ((12, 0), (12, 8), "sm_120a"),
    ((12, 0), (12, 9), "sm_120f"), ((12, 0), (13, 0), "sm_120f"),
    ((8, 0), (12, 0), "sm_80"), ((8, 6), (12, 4), "sm_80"), ((8, 9), (13, 0), "sm_80"),
]  # fmt: skip
UNSUPPORTED = [
    ((9, 0), (11, 8)),  # toolkit too old for anything
    ((10, 0), (12, 6)),  # 10.0 needs 12.8
    ((10, 3), (12, 8)),  # 10.3 < 12.9 is unsupported
    ((12, 0), (12, 6)),
    ((7, 5), (13, 0)),  # Turing
    ((8, 7), (13, 0)),  # Jetson Orin: not in the table
    ((11, 0), (13, 0)),
    ((12, 1), (13, 0)),
]


@pytest.mark.parametrize("cc,cuda,target", SUPPORTED, ids=[f"cc{c[0]}.{c[1]}-cuda{u[0]}.{u[1]}" for c, u, _ in SUPPORTED])
def test_supported_rows(cc, cuda, target):
    assert select_target(cc, cuda) == target
    assert target_runs_on(target, cc)


@pytest.mark.parametrize("cc,cuda", UNSUPPORTED, ids=[f"cc{c[0]}.{c[1]}-cuda{u[0]}.{u[1]}" for c, u in UNSUPPORTED])
def test_unsupported_rows_raise_with_reason(cc, cuda):
    with pytest.raises(UnsupportedTarget, match=r"\d+\.\d+"):
        select_target(cc, cuda)


def test_unsupported_is_inconclusive_exit_3():
    with pytest.raises(UnsupportedTarget) as info:
        select_target((7, 0), (13, 0))
    assert info.value.exit_code == 3


def _require(cc, cuda, override):
    return TargetResolver(override).require(lambda: cc, lambda: cuda)


def test_override_wins_even_where_the_policy_has_no_target():
    assert _require((9, 0), (13, 0), "sm_100f") == "sm_100f"
    assert _require((7, 5), (11, 0), "sm_80") == "sm_80"
    assert _require((9, 0), (13, 0), None) == "sm_90a"


def test_unknown_override_is_usage_error():
    with pytest.raises(UsageError, match="unknown kernel target 'sm_91'"):
        _require((9, 0), (13, 0), "sm_91")


def test_each_target_has_exactly_one_gencode():
    for name, t in TARGETS.items():
        assert t.gencode.startswith("-gencode=") and t.gencode.count("-gencode") == 1
        assert name.replace("sm_", "") in t.gencode


def test_nvcc_flags_are_the_ones_the_build_keys_were_made_with():
    # the flags are part of every library's build key: another spelling rebuilds every cache and
    # makes every certificate's fingerprint differ
    assert {t.name: (t.gencode, t.define) for t in TARGETS.values()} == {
        "sm_80": ("-gencode=arch=compute_80,code=[sm_80,compute_80]", "KDACTL_TARGET_SM80"),
        "sm_90a": ("-gencode=arch=compute_90a,code=sm_90a", "KDACTL_TARGET_SM90A"),
        "sm_100a": ("-gencode=arch=compute_100a,code=sm_100a", "KDACTL_TARGET_SM100A"),
        "sm_100f": ("-gencode=arch=compute_100f,code=sm_100f", "KDACTL_TARGET_SM100F"),
        "sm_120a": ("-gencode=arch=compute_120a,code=sm_120a", "KDACTL_TARGET_SM120A"),
        "sm_120f": ("-gencode=arch=compute_120f,code=sm_120f", "KDACTL_TARGET_SM120F"),
    }


def test_parse_target_list():
    assert [t.name for t in parse_target_list(" sm_90a, sm_100f ,sm_90a")] == ["sm_90a", "sm_100f"]
    with pytest.raises(UsageError, match="at least one"):
        parse_target_list(" , ")
    with pytest.raises(UsageError, match="unknown kernel target"):
        get_target("sm_75")


def test_decide_target_order_override_aot_toolkit_driver():
    from kdactl.targets import decide_target

    assert decide_target((9, 0), override="sm_80", aot="sm_90a", toolkit=(13, 0)) == ("sm_80", "KDACTL_CUDA_ARCH=sm_80")
    assert decide_target((9, 0), aot="sm_90a", toolkit=(12, 8))[0] == "sm_90a"
    assert decide_target((10, 0), toolkit=(12, 8)) == ("sm_100a", "cc 10.0 with CUDA toolkit 12.8 (nvcc)")
    target, why = decide_target((10, 0), driver_cuda=(13, 0))
    assert target == "sm_100f" and "driver's CUDA 13.0" in why and "AOT bundle must serve it" in why
    assert decide_target((10, 3), toolkit=(12, 8))[0] is None  # SPEC: 10.3 with CUDA < 12.9 is unsupported
    assert decide_target((9, 0)) == (None, "no CUDA toolkit (nvcc) and no driver CUDA version to choose a target with")
