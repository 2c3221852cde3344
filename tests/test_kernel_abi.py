"""kdactl.kernel_abi: the bottom layer that the C library and Python agree on. The build layer, the
fault parser and the SKU table read it without loading torch or the op."""

import ctypes
import json
import re
import subprocess
import sys

import pytest

from kdactl import kernel_abi
from kdactl.assets import csrc_dir
from kdactl.kda.routes import ROUTE_TABLE
from tests.tools import require_tool


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
    names = [name for name, _ in kernel_abi.KdaArgs._fields_[: len(kernel_abi.LEADING_POINTERS)]]
    assert tuple(names) == kernel_abi.LEADING_POINTERS
    size = ctypes.sizeof(ctypes.c_void_p)
    assert [getattr(kernel_abi.KdaArgs, n).offset for n in names] == [i * size for i in range(len(names))]


# --- the C header, as a C++ compiler reads it (kdactl_host includes it as C++, nvcc as CUDA C++) ----


def _header_program(tmp_path, body: str) -> str:
    """The output of a C++ program that includes csrc/kdactl_api.h and runs ``body``."""
    compiler = require_tool("g++", "apt-get install g++")
    src, exe = tmp_path / "abi.cpp", tmp_path / "abi"
    src.write_text(f'#include <cstddef>\n#include <cstdio>\n#include "{csrc_dir() / "kdactl_api.h"}"\n'
                   f"int main() {{\n{body}\nreturn 0;\n}}\n")  # fmt: skip
    subprocess.run([compiler, "-std=c++17", "-O0", "-o", str(exe), str(src)], check=True, capture_output=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def header_fields() -> list[str]:
    """The fields of kdactl_kda_args in the header's order."""
    text = (csrc_dir() / "kdactl_api.h").read_text()
    body = text[text.index("typedef struct {") : text.index("} kdactl_kda_args;")]
    code = "\n".join(line.split("//")[0] for line in body.splitlines()[1:])
    return [m.group(1) for m in re.finditer(r"([A-Za-z_]\w*)\s*;", code)]


def test_kda_args_has_the_fields_of_the_c_struct_in_its_order():
    fields = header_fields()
    assert "varlen" in fields and fields[:2] == ["q", "k"]  # the reader sees the struct
    assert [name for name, _ in kernel_abi.KdaArgs._fields_] == fields


def test_kda_args_has_the_c_struct_layout(tmp_path):
    lines = ['std::printf("sizeof %zu\\n", sizeof(kdactl_kda_args));']
    lines += [f'std::printf("{n} %zu %zu\\n", offsetof(kdactl_kda_args, {n}), sizeof(((kdactl_kda_args*)0)->{n}));'
              for n in header_fields()]  # fmt: skip
    layout = dict(line.split(maxsplit=1) for line in _header_program(tmp_path, "\n".join(lines)).splitlines())
    assert int(layout.pop("sizeof")) == ctypes.sizeof(kernel_abi.KdaArgs)
    ours = {n: f"{getattr(kernel_abi.KdaArgs, n).offset} {getattr(kernel_abi.KdaArgs, n).size}" for n in layout}
    assert layout == ours


def test_the_c_header_has_the_abi_version_routes_and_constants(tmp_path):
    lines = ['std::printf("ABI_VERSION %d\\n", KDACTL_ABI_VERSION);',
             '#define ROUTE(id, name) std::printf("route %d %s\\n", id, #name);', "KDACTL_ROUTES(ROUTE)"]  # fmt: skip
    lines += [f'std::printf("{n} %lld\\n", (long long)KDACTL_{n});' for n in kernel_abi.EXPECTED_CONSTANTS]
    out = _header_program(tmp_path, "\n".join(lines)).splitlines()
    assert [line.split()[1:] for line in out if line.startswith("route ")] == [
        [str(i), name] for i, name in enumerate(kernel_abi.ROUTES)
    ]
    values = dict(line.split() for line in out if not line.startswith("route "))
    assert values == {"ABI_VERSION": str(kernel_abi.ABI_VERSION),
                      **{n: str(v) for n, v in kernel_abi.EXPECTED_CONSTANTS.items()}}  # fmt: skip


def test_a_call_leads_with_the_fields_kdactl_host_reads():
    from kdactl.kda.call import PrefillCall

    assert PrefillCall._fields[: len(kernel_abi.CALL_FIELDS)] == kernel_abi.CALL_FIELDS
    assert kernel_abi.CALL_FIELDS[: len(kernel_abi.CALL_TENSORS)] == kernel_abi.CALL_TENSORS
