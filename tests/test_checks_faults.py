"""The pieces of the validation suite that a CPU can check: KDACTL_FAULT parsing, the positive-control
library (built through the one builder, kept out of the kernel library's key), reading a library's
device code, and the payload/control scripts ending without their sentinel where there is no GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kdactl.assets import checks_dir, csrc_dir
from kdactl.errors import UsageError
from kdactl.faults import Fault, fault_from_env, hang_or_crash, parse_fault, perturb_output, wants_sanitizer_fault
from kdactl.jit.devcode import embedded_sms, parse_list_elf
from kdactl.sanitizer.faultlib import CONTROL_FOR_TOOL, FAULTS, build_faults
from kdactl.jit.spec import faults_library_spec, kernel_library_spec
from kdactl.sanitizer import TOOLS
from kdactl.settings import Settings
from kdactl.targets import get_target


@pytest.mark.parametrize(
    "value,expected",
    [(None, None), ("", None), ("hang", Fault("hang")), ("crash", Fault("crash")), ("sanitizer", Fault("sanitizer")),
     ("wrong-result:direct", Fault("wrong-result", "direct"))],
)  # fmt: skip
def test_parse_fault(value, expected):
    assert parse_fault(value) == expected


@pytest.mark.parametrize("value", ["hnag", "wrong-result", "wrong-result:", "wrong-result:nosuch", "hang:5", "hang:", "crash:now"])
def test_bad_fault_value_raises_naming_it_and_the_valid_ones(value):
    with pytest.raises(ValueError, match="KDACTL_FAULT=.*valid values: wrong-result:direct, wrong-result:chunk") as err:
        parse_fault(value)
    assert repr(value) in str(err.value)


def test_fault_from_env_is_a_usage_error():
    assert fault_from_env({"KDACTL_FAULT": "slow"}) == Fault("slow") and fault_from_env({}) is None
    with pytest.raises(UsageError, match="'garbage'") as err:
        fault_from_env({"KDACTL_FAULT": "garbage"})
    assert err.value.exit_code == 2


def test_perturb_only_the_named_route():
    import torch

    o = torch.zeros(3)
    env = {"KDACTL_FAULT": "wrong-result:direct"}
    assert torch.equal(perturb_output("direct", o, env), torch.ones(3))
    assert perturb_output("chunk", o, env) is o
    assert perturb_output("direct", o, {}) is o
    with pytest.raises(ValueError, match="no route 'nosuch'"):
        perturb_output("direct", o, {"KDACTL_FAULT": "wrong-result:nosuch"})


def test_hang_and_crash_are_inert_without_the_variable():
    hang_or_crash({})
    hang_or_crash({"KDACTL_FAULT": "sanitizer"})
    assert wants_sanitizer_fault({"KDACTL_FAULT": "sanitizer"}) and not wants_sanitizer_fault({})


def test_crash_fault_aborts_a_process():
    code = "from kdactl.faults import hang_or_crash; hang_or_crash({'KDACTL_FAULT': 'crash'})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == -6


def test_every_tool_has_one_control_fault():
    assert set(CONTROL_FOR_TOOL) == set(TOOLS) and len(FAULTS) == 4


def test_fault_sources_stay_out_of_the_kernel_library():
    target = get_target("sm_90a")
    kernel = kernel_library_spec(target)
    assert not any("faults" in p.parts for p in (*kernel.sources, *kernel.headers))
    faults = faults_library_spec(target)
    assert faults.name == "kdactl_faults" and faults.so_name == "libkdactl_faults.so"
    assert [p.name for p in faults.sources] == ["faults.cu"] and target.gencode in faults.cflags


def test_faults_library_builds_for_sm90a_through_the_builder(tmp_path, nvcc_toolkit):
    settings = Settings.from_env({"KDACTL_CACHE_DIR": str(tmp_path / "cache"), "KDACTL_NVCC": nvcc_toolkit.nvcc})
    library = build_faults(settings, "sm_90a")
    assert library.name == "libkdactl_faults.so" and library.is_file()
    assert embedded_sms(library.read_bytes()) == {90}
    assert build_faults(settings, "sm_90a") == library  # second time: from the cache
    symbols = subprocess.run(["nm", "-D", str(library)], capture_output=True, text=True).stdout
    assert "kdactl_fault_run" in symbols


def test_parse_list_elf():
    text = "ELF file    1: libkdactl.1.sm_90a.cubin\nELF file    2: libkdactl.2.sm_90a.cubin\nPTX file 1: x.sm_80.ptx\n"
    assert parse_list_elf(text) == {"sm_90a"}
    assert embedded_sms(b"no elf here") == set()


def test_control_script_without_library_reports_and_exits_3(tmp_path):
    proc = subprocess.run([sys.executable, str(checks_dir() / "control.py"), "--lib", str(tmp_path / "none.so"),
                           "--fault", "oob"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 3 and "KDACTL-CONTROL-ERROR fault=oob" in proc.stdout and "launched=1" not in proc.stdout


def test_payload_without_gpu_prints_no_sentinel():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the payload really runs (GPU run)")
    proc = subprocess.run([sys.executable, str(checks_dir() / "payload.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "KDACTL-PAYLOAD-ERROR" in proc.stdout and "KDACTL-PAYLOAD-OK" not in proc.stdout


def test_fault_kernel_names_are_filterable():
    text = (csrc_dir() / "faults" / "faults.cu").read_text()
    for fault in FAULTS:
        assert f"__global__ void kdactl_fault_{fault}(" in text
