"""GPU health facts: the NVML reader over a fake, the kernel-log XID parser, the judging rules row
by row, and the checks in certify's certificate, JUnit file and textfile metrics. CPU only."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pynvml
import pytest

from kdactl.certify.orchestrate import health_checks
from kdactl.certify.outputs import junit_xml, prom_text
from kdactl.hw.health import HealthFacts, judge_health, read_health, xids_for
from kdactl.hw.nvml import PynvmlDriver, _Caller
from tests import certify_fakes as cf
from tests.fakes import H200, FakeNvml

LOG = """\
[   12.000000] nvidia: module license 'NVIDIA' taints kernel.
[ 3605.118831] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics Exception
[ 3611.431000] NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', GPU has fallen off the bus.
[ 3700.000001] NVRM: Xid (PCI:0000:18:00): 94, pid=4242, Contained: SM (0x1). RST: No, D-RST: No
"""


class HealthNvml(FakeNvml):
    """FakeNvml with the health functions; ``values`` overrides any of them per name."""

    def __init__(self, values=None, unsupported=(), **kw):
        super().__init__([H200], **kw)
        self.values = {
            "ecc": (0, 0), "remap": (2, 0, 0, 0), "retired": ([], [], 0), "pcie": (5, 5, 16, 16),
            "clocks": {1: (1980, 1980), 2: (3201, 3201)}, "bus": b"00000000:18:00.0", **(values or {}),
        }  # fmt: skip
        self.unsupported = set(unsupported)

    def _v(self, fn, key):
        self._enter(fn)
        if fn in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.values[key]

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._v("nvmlDeviceGetTotalEccErrors", "ecc")[counter]

    def nvmlDeviceGetRemappedRows(self, h):
        return self._v("nvmlDeviceGetRemappedRows", "remap")

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return self._v("nvmlDeviceGetRetiredPages", "retired")[cause]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._v("nvmlDeviceGetRetiredPagesPendingStatus", "retired")[2]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._v("nvmlDeviceGetCurrPcieLinkGeneration", "pcie")[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._v("nvmlDeviceGetMaxPcieLinkGeneration", "pcie")[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._v("nvmlDeviceGetCurrPcieLinkWidth", "pcie")[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._v("nvmlDeviceGetMaxPcieLinkWidth", "pcie")[3]

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._v("nvmlDeviceGetClockInfo", "clocks")[clock][0]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._v("nvmlDeviceGetMaxClockInfo", "clocks")[clock][1]

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._v("nvmlDeviceGetPciInfo", "bus"))


def read(lib, log=LOG) -> HealthFacts:
    gpus = PynvmlDriver(lib, kernel_log=lambda: log).read().gpus
    return gpus[0].health


def statuses(h: HealthFacts) -> dict[str, str]:
    return {r.check: r.status for r in judge_health(h, 0)}


# --- reading -----------------------------------------------------------------------------------


def test_reader_takes_every_fact_of_a_healthy_gpu():
    h = read(HealthNvml())
    assert h.ecc_uncorrected == {"volatile": 0, "aggregate": 0}
    assert h.remap == {"corrected": 2, "uncorrected": 0, "pending": 0, "failed": 0}
    assert h.retired_pages == {"single_bit": 0, "double_bit": 0, "pending": 0}
    assert h.pcie == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}
    assert h.clocks_mhz == {"sm": 1980, "sm_max": 1980, "mem": 3201, "mem_max": 3201}
    assert h.xids == (13, 94) and h.unread == {}


def test_what_the_driver_cannot_read_is_a_skip_with_the_reason():
    h = read(HealthNvml(unsupported={"nvmlDeviceGetRetiredPages", "nvmlDeviceGetTotalEccErrors"}))
    assert h.retired_pages is None and "not supported" in h.unread["retired_pages"]
    results = {r.check: r for r in judge_health(h, 0)}
    assert results["health.ecc"].status == "skip" and not results["health.ecc"].required
    assert results["health.remap"].status == "pass"


def test_an_old_nvml_without_the_functions_reads_no_health_but_still_detects():
    gpu = PynvmlDriver(FakeNvml([H200]), kernel_log=lambda: LOG).read().gpus[0]
    assert gpu.name == "NVIDIA H200" and gpu.health.ecc_uncorrected is None and gpu.health.xids is None
    assert set(statuses(gpu.health).values()) == {"skip"}


def test_an_unreadable_kernel_log_is_a_skip_naming_why():
    def denied():
        raise PermissionError("cannot read the kernel log (/dev/kmsg, dmesg: Operation not permitted)")

    h = PynvmlDriver(HealthNvml(), kernel_log=denied).read().gpus[0].health
    assert h.xids is None and "Operation not permitted" in h.unread["xids"]
    assert statuses(h)["health.xid"] == "skip"


def test_nvml_error_on_one_fact_leaves_the_others():
    lib = HealthNvml(fail={"nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_UNKNOWN})
    h = read_health(_Caller(lib), H200, 0, lambda: "")
    assert h.remap is None and "NVML nvmlDeviceGetRemappedRows" in h.unread["remap"] and h.pcie is not None


def test_xids_are_matched_to_the_gpus_bus():
    assert xids_for(LOG, "00000000:18:00.0") == (13, 94)
    assert xids_for(LOG, "00000000:2A:00.0") == (79,)
    assert xids_for(LOG, "00000000:3b:00.0") == ()


# --- judging -----------------------------------------------------------------------------------

OK = cf.HEALTHY


@pytest.mark.parametrize(
    "change,check,status,words",
    [
        ({}, "health.ecc", "pass", "0 since boot"),
        ({"ecc_uncorrected": {"volatile": 1, "aggregate": 1}}, "health.ecc", "fail", "1 since boot"),
        ({"ecc_uncorrected": {"volatile": 0, "aggregate": 3}}, "health.ecc", "fail", "3 lifetime"),
        ({"remap": {"corrected": 0, "uncorrected": 1, "pending": 1, "failed": 0}}, "health.remap", "fail", "reset the GPU"),
        ({"remap": {"corrected": 0, "uncorrected": 1, "pending": 0, "failed": 1}}, "health.remap", "fail", "FAILED"),
        ({"remap": {"corrected": 5, "uncorrected": 0, "pending": 0, "failed": 0}}, "health.remap", "pass", "5 corrected"),
        ({"retired_pages": {"single_bit": 1, "double_bit": 0, "pending": 1}}, "health.retired_pages", "fail", "pending retirement"),
        ({"pcie": {"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}}, "health.pcie", "warn", "x8"),
        ({"pcie": {"gen": 1, "max_gen": 5, "width": 16, "max_width": 16}}, "health.pcie", "pass", "power saving"),
        ({"clocks_mhz": {"sm": 345, "sm_max": 1980, "mem": 3201, "mem_max": 3201}}, "health.clocks", "pass", "SM 345/1980"),
        ({"clocks_mhz": {"sm": 0, "sm_max": 0, "mem": 0, "mem_max": 0}}, "health.clocks", "warn", "no maximum"),
        ({"xids": (13, 31)}, "health.xid", "warn", "13, 31"),
        ({"xids": (13, 79)}, "health.xid", "fail", "GPU fault: 79"),
    ],
)
def test_rules(change, check, status, words):
    r = next(r for r in judge_health(replace(OK, **change), 2) if r.check == check)
    assert (r.status, r.gpu) == (status, 2) and words in r.message, r.message


def test_without_nvml_there_is_one_skip():
    (r,) = judge_health(None, 1)
    assert r.status == "skip" and not r.required and "NVML" in r.message


# --- in certify's outputs ----------------------------------------------------------------------


def test_a_sick_gpu_fails_certify_and_shows_in_every_output(tmp_path):
    sick = replace(OK, remap={"corrected": 0, "uncorrected": 2, "pending": 1, "failed": 0})
    node = cf.node(2, gpus=(cf.gpu(0), cf.gpu(1, health=sick)))
    from tests.test_certify_command import run

    rep = run(tmp_path, facts=node)
    assert rep.exit_code == 1 and "gpu1:health.remap: pending row remap: reset the GPU" in rep.reason
    assert rep.cert["gpus"][1]["health"]["remap"]["pending"] == 1
    results = [r for r in rep.cert["results"] if r["check"].startswith("health.")]
    assert len(results) == 12 and {r["gpu"] for r in results} == {0, 1}
    xml = junit_xml(rep.cert)
    assert 'name="health.remap"' in xml and "reset the GPU to apply it" in xml
    prom = prom_text(rep.cert)
    assert 'check="health.remap"' in prom


def test_health_checks_cover_the_selected_gpus_only():
    gpus = (cf.gpu(3),)
    assert {r.gpu for r in health_checks(gpus)} == {3}


def test_a_repeated_xid_is_said_once_with_its_count():
    """Seen on the H200: every killed co-tenant leaves an XID 43; six of them read as one line."""
    (r,) = [r for r in judge_health(replace(OK, xids=(43,) * 6 + (13,)), 0) if r.check == "health.xid"]
    assert r.status == "warn" and r.message == "XID events since boot: 13, 43 (6 times)"
