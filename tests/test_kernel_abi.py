"""kdactl.kernel_abi: the bottom layer that the C library and Python agree on. The build layer, the
fault parser and the SKU table read it without loading torch or the op."""

import json
import subprocess
import sys

import pytest

from kdactl import kernel_abi
from kdactl.kda.routes import ROUTE_TABLE


@pytest.mark.parametrize("module", ["kdactl.kernel_abi", "kdactl.faults", "kdactl.skus", "kdactl.jit.library"])
def test_the_lower_layers_load_neither_torch_nor_the_op(module):
    code = f"import json, sys, {module}\nprint(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('kdactl.kda'))))"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_the_route_records_follow_the_abi_route_table():
    assert tuple(r.name for r in ROUTE_TABLE) == kernel_abi.ROUTES
    assert [r.id for r in ROUTE_TABLE] == [kernel_abi.ROUTE_IDS[r.name] for r in ROUTE_TABLE] == list(range(3))


def test_every_expected_constant_is_one_of_the_named_groups():
    assert kernel_abi.EXPECTED_CONSTANTS == {
        **kernel_abi.SHARED_CONSTANTS, **kernel_abi.FUSED_CONSTANTS, "ERR_WRONG_DEVICE": 10001, "ERR_UNSUPPORTED": 10003,
    }  # fmt: skip


def test_the_leading_pointers_are_the_first_fields_of_kda_args():
    import ctypes

    names = [name for name, _ in kernel_abi.KdaArgs._fields_[: len(kernel_abi.LEADING_POINTERS)]]
    assert tuple(names) == kernel_abi.LEADING_POINTERS
    size = ctypes.sizeof(ctypes.c_void_p)
    assert [getattr(kernel_abi.KdaArgs, n).offset for n in names] == [i * size for i in range(len(names))]
