import pytest

import dataclasses

from kdactl.bench.suites import SERVING, SUITES, parse_shape, parse_varlen, resolve_shapes, suite_shapes
from kdactl.errors import UsageError


def test_suites_match_the_issue():
    assert [s.label for s in SUITES["small-bh"]] == [
        "B1-T65536-H8-D128", "B1-T65536-H4-D128", "B1-T131072-H1-D128", "B1-T1048576-H1-D128"]  # fmt: skip
    serving = [s.label for s in SUITES["serving"]]
    assert serving[:4] == ["B1-T8192-H64-D128", "B1-T8192-H96-D128", "B2-T16384-H64-D128", "B8-T4096-H12-D128"]
    assert serving[4] == "varlen(1300,547,2048,963,271,3063)-H96-D128"
    v = SUITES["serving"][4]
    assert v.batch == 1 and v.seqlen == sum(v.seqlens) and v.varlen
    assert len(suite_shapes("all")) == sum(len(s) for s in SUITES.values())


def test_smoke_is_small():
    assert all(s.tokens * s.heads <= 1 << 16 for s in SUITES["smoke"])
    assert any(s.varlen for s in SUITES["smoke"])


def test_parse_shape():
    s = parse_shape("2,1024,16")
    assert (s.batch, s.seqlen, s.heads, s.key_dim, s.value_dim) == (2, 1024, 16, 128, 128)
    assert parse_shape("1, 64, 2, 64, 128").label == "B1-T64-H2-K64-V128"


@pytest.mark.parametrize("bad", ["1,2", "1,2,3,4", "a,b,c", "0,10,1", ""])
def test_parse_shape_rejects(bad):
    with pytest.raises(UsageError, match="--shape"):
        parse_shape(bad)


def test_parse_varlen():
    s = parse_varlen("17,0,300", 4)
    assert s.seqlens == (17, 0, 300) and s.seqlen == 317 and s.heads == 4
    with pytest.raises(UsageError, match="--heads"):
        parse_varlen("17,300", None)
    with pytest.raises(UsageError, match="--varlen"):
        parse_varlen("0,0", 4)
    with pytest.raises(UsageError, match="--varlen"):
        parse_varlen("-1,3", 4)


def test_resolve_defaults_and_dedupes():
    assert resolve_shapes(None) == list(SUITES["smoke"])
    only = resolve_shapes(None, shapes=["1,4096,8"])
    assert [s.label for s in only] == ["B1-T4096-H8-D128"]
    both = resolve_shapes("smoke", shapes=["1,4096,8"], varlens=["5,6"], heads=2)
    assert len(both) == len(SUITES["smoke"]) + 1  # 1,4096,8 is already in smoke
    assert both[-1].label == "varlen(5,6)-H2-D128"
    with pytest.raises(UsageError, match="--suite"):
        resolve_shapes("nope")
    with pytest.raises(UsageError, match="--heads"):
        resolve_shapes(None, shapes=["1,8,1"], heads=3)


def test_production_is_the_lower_bound_config_at_serving_and_per_rank_shapes():
    prod = SUITES["production"]
    assert {s.config for s in prod} == {"lower-bound"}
    assert [s.label for s in prod[:5]] == [s.label for s in SERVING]
    fixed_heads = {(s.heads, s.seqlen) for s in prod[5:] if not s.varlen}
    assert fixed_heads == {(h, t) for h in (12, 16, 24) for t in (4096, 8192, 16384, 32768)}
    assert {(s.seqlens, s.heads) for s in prod if s.varlen and s.heads != 96} == {
        ((1300, 547, 2048, 963, 271, 3063), 16), ((1300, 547, 2048, 963, 271, 3063), 24),
        ((16384, 512, 300, 1200, 64), 16)}  # fmt: skip
    assert len({s.key for s in prod}) == len(prod)


def test_kimi_linear_is_the_softplus_config_at_its_per_rank_heads():
    kimi = SUITES["kimi-linear"]
    assert {s.config for s in kimi} == {"softplus"}
    assert {s.heads for s in kimi if not s.varlen} == {4, 8, 16, 32}
    assert {s.seqlen for s in kimi if not s.varlen} == {8192, 32768}
    assert sum(s.varlen for s in kimi) == 1


def test_keys_stay_labels_for_plain_shapes():
    assert [s.key for s in SUITES["smoke"]] == ["B1-T4096-H8-D128", "B2-T1024-H16-D128", "varlen(17,300,1000)-H4-D128"]
    assert SUITES["production"][0].key == "lower-bound:B1-T8192-H64-D128"
    assert SUITES["production"][0].label == "B1-T8192-H64-D128"
    with pytest.raises(ValueError, match="configuration"):
        dataclasses.replace(SERVING[0], config="nope")


def test_config_overrides_suites_and_shapes():
    serving = resolve_shapes("serving", config="lower-bound")
    assert [s.key for s in serving] == [f"lower-bound:{s.label}" for s in SERVING]
    assert {s.config for s in resolve_shapes("production", config="plain")} == {"plain"}
    assert resolve_shapes(None, shapes=["1,64,2"])[0].config == "plain"
    assert resolve_shapes(None, shapes=["1,64,2"], config="softplus")[0].key == "softplus:B1-T64-H2-D128"
    with pytest.raises(UsageError, match="--config"):
        resolve_shapes("serving", config="fused")
    # One shape in two configurations is two runs (suite all); the same one twice is one.
    keys = [s.key for s in resolve_shapes("all")]
    assert len(keys) == len(set(keys)) == sum(len(v) for v in SUITES.values())


def test_gate_params_apply_to_fused_shapes_and_key_them():
    mixed = resolve_shapes("smoke", shapes=["1,64,2"], config="lower-bound", gate_params="flashkda")
    assert {s.key.split(":")[0] for s in mixed} == {"lower-bound[flashkda]"}
    assert resolve_shapes(None, shapes=["1,64,2"], config="softplus", gate_params="test")[0].key == "softplus:B1-T64-H2-D128"
    assert resolve_shapes(None, shapes=["1,64,2"], config="softplus", gate_params="init")[0].key == "softplus[init]:B1-T64-H2-D128"
    both = resolve_shapes("all", gate_params="flashkda")  # plain shapes keep their key, fused ones change
    assert {s.gate_params for s in both if s.config == "plain"} == {"test"}
    assert {s.gate_params for s in both if s.config != "plain"} == {"flashkda"}
    assert mixed[0].to_json()["gate_params"] == "flashkda"
    with pytest.raises(UsageError, match="--gate-params must be one of test, init, flashkda"):
        resolve_shapes(None, shapes=["1,64,2"], config="softplus", gate_params="trained")
    with pytest.raises(UsageError, match="none of the shapes has one"):
        resolve_shapes("serving", gate_params="flashkda")
    with pytest.raises(ValueError, match="no gate parameters"):
        dataclasses.replace(SERVING[0], gate_params="flashkda")
