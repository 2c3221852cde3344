"""kdactl.skus and fleet/skus.toml: the matrix loads, agrees with the target policy, and bad entries
are rejected naming the key."""

from __future__ import annotations

import copy
import tomllib

import pytest

from kdactl.errors import UnsupportedTarget
from kdactl.skus import ROUTES, SHAPE_CLASSES, SKU_NAMES, SkuMatrixError, load_skus, parse_skus, skus_path
from kdactl.targets import select_target

CUDA_VERSIONS = [(11, 8)] + [(12, m) for m in range(10)] + [(13, m) for m in range(10)]


def test_matrix_has_every_spec_sku():
    m = load_skus()
    assert list(m) == list(SKU_NAMES)
    assert (m["H200"].cc, m["H200"].sm_count, m["H200"].l2_mib) == ((9, 0), 132, 60.0)


@pytest.mark.parametrize("sku", SKU_NAMES)
def test_targets_agree_with_the_policy(sku):
    spec = load_skus()[sku]
    for cuda in CUDA_VERSIONS:
        try:
            want = select_target(spec.cc, cuda)
        except UnsupportedTarget:
            want = None
        got = spec.target_for(cuda)
        assert got == want, (
            f"fleet/skus.toml [{sku}.targets] gives {got or 'no target'} for CUDA {cuda[0]}.{cuda[1]} on cc "
            f"{spec.cc[0]}.{spec.cc[1]}, kdactl.targets.select_target {want or 'no target'}"
        )


@pytest.mark.parametrize("sku", SKU_NAMES)
def test_routes_cover_every_shape_class(sku):
    routes = load_skus()[sku].routes
    assert set(routes) == set(SHAPE_CLASSES) and set(routes.values()) <= set(ROUTES)


def _raw():
    with open(skus_path(), "rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: d.update({"H300": d["H200"]}), r"\[H300\] is not a SKU kdactl knows"),
        (lambda d: d["H200"].update(cc="9"), r"\[H200\] cc must be a \"major.minor\" string, got '9'"),
        (lambda d: d["H200"].update(sm_count="132"), r"\[H200\] sm_count must be a positive integer, got '132'"),
        (lambda d: d["B200"].update(memory_gib=[]), r"\[B200\] memory_gib must be a non-empty list"),
        (lambda d: d["B200"].update(l2_mib=0), r"\[B200\] l2_mib must be a positive number"),
        (lambda d: d["B200"].update(sms=148), r"\[B200\] has unknown keys \['sms'\]"),
        (lambda d: d["B200"]["targets"].update({"12.10.1": "sm_100f"}), r"\[B200.targets\] key '12.10.1' is not a CUDA version"),
        (lambda d: d["B200"]["targets"].update({"12.9": "sm_100"}), r"\[B200.targets\] 12.9 = 'sm_100' is not a target"),
        (lambda d: d["L40S"]["routes"].pop("serving"), r"\[L40S.routes\] must name exactly the shape classes"),
        (lambda d: d["L40S"]["routes"].update(serving="fast"), r"\[L40S.routes\] serving = 'fast' is not a route"),
    ],
)
def test_bad_entries_name_the_key(edit, words):
    data = copy.deepcopy(_raw())
    edit(data)
    with pytest.raises(SkuMatrixError, match=words) as err:
        parse_skus(data, source="fleet/skus.toml")
    assert err.value.exit_code == 2


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(SkuMatrixError, match="SKU matrix not found"):
        load_skus(tmp_path / "nope.toml")
    bad = tmp_path / "skus.toml"
    bad.write_text("[H200\n")
    with pytest.raises(SkuMatrixError, match="cannot read the SKU matrix"):
        load_skus(bad)
