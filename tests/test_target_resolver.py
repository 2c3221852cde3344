"""kdactl.jit.resolver: the one target resolver, on fake inputs (a bundle index on disk, lambdas for
the device and the nvcc), and the rule that nothing else calls the target policy."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest

from kdactl.errors import Inconclusive, UnsupportedTarget, UsageError
from kdactl.hw.facts import GpuFacts
from kdactl.jit.aot import AOT_SCHEMA
from kdactl.jit.resolver import TargetResolver, bundle_target_for, one_target

ROOT = Path(__file__).resolve().parents[1]


def _bundle(tmp_path: Path, entries: dict) -> Path:
    (tmp_path / "aot").mkdir()
    (tmp_path / "aot" / "manifest.json").write_text(json.dumps({"schema": AOT_SCHEMA, "entries": entries}))
    return tmp_path / "aot"


def _never(what: str):
    def read():
        raise AssertionError(f"the resolver read {what} it did not need")

    return read


def _gpu(index: int, target: str | None, reason: str = "why", cc=(9, 0)) -> GpuFacts:
    return GpuFacts(index, f"GPU-{index}", "NVIDIA H200", "H200", cc, 132, 143771, None, None, None, target, reason)


def test_override_wins_and_reads_neither_device_nor_bundle_nor_nvcc(tmp_path):
    r = TargetResolver("sm_100f", tmp_path / "no-such-bundle")
    assert r.require(_never("the device"), _never("nvcc")) == "sm_100f"
    assert r.decide((9, 0), toolkit=(13, 0)) == ("sm_100f", "KDACTL_CUDA_ARCH=sm_100f")
    assert r.node_target(_never("the node's GPUs")) == "sm_100f"
    assert r.targets_for([(9, 0), (12, 0)], (13, 0), {"sm_80"}) == {"sm_100f"}


def test_unknown_override_is_a_usage_error_everywhere():
    r = TargetResolver("sm_91")
    for ask in (r.override_target, lambda: r.require(lambda: (9, 0), lambda: (13, 0)), lambda: r.decide((9, 0))):
        with pytest.raises(UsageError, match="unknown kernel target 'sm_91'"):
            ask()


def test_bundle_entry_is_chosen_without_reading_nvcc(tmp_path):
    r = TargetResolver(aot_dir=_bundle(tmp_path, {"sm_90a": {"nvcc_version": "12.8"}}))
    assert r.bundle_target((9, 0)) == "sm_90a"
    assert r.require(lambda: (9, 0), _never("nvcc")) == "sm_90a"
    assert r.decide((9, 0), toolkit=(12, 4)) == ("sm_90a", "the AOT bundle's entry for cc 9.0")


def test_a_bundle_without_an_entry_for_the_device_falls_to_the_policy_with_nvcc(tmp_path):
    r = TargetResolver(aot_dir=_bundle(tmp_path, {"sm_90a": {"nvcc_version": "12.8"}}))
    assert r.bundle_target((10, 3)) is None
    assert r.require(lambda: (10, 3), lambda: (13, 0)) == "sm_100f"
    assert r.decide((10, 0), toolkit=(12, 8)) == ("sm_100a", "cc 10.0 with CUDA toolkit 12.8 (nvcc)")


def test_without_nvcc_the_drivers_cuda_decides_and_says_only_a_bundle_serves_it():
    target, why = TargetResolver().decide((10, 0), driver_cuda=(13, 0))
    assert target == "sm_100f" and "driver's CUDA 13.0" in why and "AOT bundle must serve it" in why
    assert TargetResolver().decide((9, 0)) == (
        None,
        "no CUDA toolkit (nvcc) and no driver CUDA version to choose a target with",
    )


def test_no_target_is_unsupported_exit_3_with_the_policys_reason():
    with pytest.raises(UnsupportedTarget, match=r"cc 10\.3 needs CUDA toolkit >= 12\.9") as info:
        TargetResolver().require(lambda: (10, 3), lambda: (12, 8))
    assert info.value.exit_code == 3
    assert TargetResolver().decide((7, 5), toolkit=(13, 0)) == (None, "no kernel target for compute capability 7.5")


def test_unreadable_bundle_index_is_no_bundle(tmp_path, caplog):
    (tmp_path / "aot").mkdir()
    (tmp_path / "aot" / "manifest.json").write_text("{not json")
    r = TargetResolver(aot_dir=tmp_path / "aot")
    with caplog.at_level(logging.WARNING, logger="kdactl.jit"):
        assert r.bundle_target((9, 0)) is None
    assert "ignoring the AOT bundle" in caplog.text
    assert r.require(lambda: (9, 0), lambda: (13, 0)) == "sm_90a"
    assert TargetResolver(aot_dir=tmp_path / "missing").bundle_target((9, 0)) is None


@pytest.mark.parametrize(
    "entries, cc, want",
    [
        # the entry whose own nvcc the policy maps to it, over one built by an nvcc that maps elsewhere
        ({"sm_100a": {"nvcc_version": "13.0"}, "sm_100f": {"nvcc_version": "13.0"}}, (10, 0), "sm_100f"),
        ({"sm_100a": {"nvcc_version": "12.8"}, "sm_100f": {"nvcc_version": "13.0"}}, (10, 0), "sm_100a"),
        # none matches its nvcc (or says which): any that runs on the device
        ({"sm_100a": {}, "sm_90a": {"nvcc_version": "x"}}, (10, 0), "sm_100a"),
        ({"sm_120f": "not an entry"}, (12, 0), "sm_120f"),
        # nothing in the bundle runs on the device
        ({"sm_90a": {"nvcc_version": "13.0"}}, (8, 6), None),
        ({}, (9, 0), None),
    ],
)
def test_bundle_target_for(entries, cc, want):
    assert bundle_target_for(entries, cc) == want


def test_one_target_for_the_node():
    assert one_target((_gpu(0, "sm_90a"), _gpu(1, "sm_90a"))) == "sm_90a"
    with pytest.raises(UnsupportedTarget, match=r"GPU 1 \(NVIDIA H200, cc 10\.3\): no nvcc"):
        one_target((_gpu(0, "sm_90a"), _gpu(1, None, "no nvcc", cc=(10, 3))))
    with pytest.raises(Inconclusive, match="mixed node: .*GPU 0 NVIDIA H200: sm_90a, GPU 1 NVIDIA H200: sm_80"):
        one_target((_gpu(0, "sm_90a"), _gpu(1, "sm_80")))


def test_targets_for_uses_the_fallback_only_where_nothing_decides():
    r = TargetResolver()
    assert r.targets_for([(9, 0), (9, 0)], (13, 0), {"sm_80"}) == {"sm_90a"}
    assert r.targets_for([(9, 0)], None, {"sm_90a", "sm_100f"}) == {"sm_90a", "sm_100f"}
    assert r.targets_for([(9, 0), (7, 5)], (13, 0), {"sm_80"}) == {"sm_90a", "sm_80"}


POLICY = {"decide_target", "select_target"}


def _policy_callers(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.alias):
            name = node.name.rpartition(".")[2]
        if name in POLICY:
            out.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')} uses {name}")
    return out


def test_only_the_resolver_calls_the_target_policy():
    allowed = {ROOT / "kdactl" / "targets.py", ROOT / "kdactl" / "jit" / "resolver.py"}
    files = sorted((ROOT / "kdactl").rglob("*.py")) + sorted((ROOT / "checks").rglob("*.py"))
    offenders = [line for f in files if f not in allowed for line in _policy_callers(f)]
    assert not offenders, "ask kdactl.jit.resolver.TargetResolver instead:\n" + "\n".join(offenders)
