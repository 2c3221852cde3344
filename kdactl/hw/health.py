"""GPU health facts, read once through NVML (and the kernel log for XID events), judged by pure
functions into ``health.*`` checks.

What a driver cannot tell (an old GPU, a feature it lacks, a log we may not read) is recorded with
the reason and judged as a skip, never as a pass. Rules: uncorrectable ECC errors, a failed row
remap, or pages waiting for retirement fail the node; a pending row remap fails it until the GPU is
reset (the remap takes effect then); a narrower PCIe link than the slot's maximum warns (a lower
link generation does not: idle GPUs train down to save power); XID events that mean memory, bus or
firmware trouble fail, other XIDs warn.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kdactl.results import CheckResult

# pynvml constants, by value (stable in NVML's ABI): uncorrected errors, volatile / aggregate counters,
# SM / memory clocks, retired-page causes (multiple single-bit, double-bit).
_UNCORRECTED, _VOLATILE, _AGGREGATE, _CLOCK_SM, _CLOCK_MEM = 1, 0, 1, 1, 2
_RETIRED_SBE, _RETIRED_DBE = 0, 1
# XIDs that mean the GPU itself is in trouble (NVIDIA's XID catalog): double-bit ECC, row-remap
# events, NVLink, fallen off the bus, high single-bit ECC rate, contained / uncontained ECC, GSP.
BAD_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


@dataclass(frozen=True)
class HealthFacts:
    """Each fact is None where it could not be read; ``unread`` says why, by fact name."""

    ecc_uncorrected: dict[str, int] | None = None  # {"volatile": n, "aggregate": n}
    remap: dict[str, int] | None = None  # corrected, uncorrected, pending (0/1), failed (0/1)
    retired_pages: dict[str, int] | None = None  # single_bit, double_bit, pending (0/1)
    pcie: dict[str, int] | None = None  # gen, max_gen, width, max_width
    clocks_mhz: dict[str, int] | None = None  # sm, sm_max, mem, mem_max
    xids: tuple[int, ...] | None = None  # XID codes in the kernel log since boot
    unread: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


# ---------------------------------------------------------------------------------------------
# Reading (NVML through kdactl.hw.nvml's caller; the kernel log through a provider)


def read_health(call: Callable[..., Any], handle: Any, index: int, kernel_log: Callable[[], str]) -> HealthFacts:
    """Every fact of one GPU; one that fails or is not supported is left None with the reason."""
    facts: dict[str, Any] = {}
    unread: dict[str, str] = {}

    def take(name: str, read: Callable[[], Any]) -> None:
        try:
            value = read()
        except Exception as err:  # noqa: BLE001 - one unreadable fact must not hide the others
            unread[name] = f"{type(err).__name__}: {err}"
            return
        if value is None:
            unread[name] = "not supported by this GPU or driver"
        facts[name] = value

    def nv(fn: str, *args: Any) -> Any:
        return call(fn, handle, *args, gpu=index, optional=True)

    def both(*values: Any) -> tuple | None:
        return None if any(v is None for v in values) else values

    def ecc():
        v = both(
            nv("nvmlDeviceGetTotalEccErrors", _UNCORRECTED, _VOLATILE),
            nv("nvmlDeviceGetTotalEccErrors", _UNCORRECTED, _AGGREGATE),
        )
        return v and {"volatile": int(v[0]), "aggregate": int(v[1])}

    def remap():
        v = nv("nvmlDeviceGetRemappedRows")  # (corrected, uncorrected, pending, failed)
        return v and dict(zip(("corrected", "uncorrected", "pending", "failed"), (int(x) for x in v)))

    def retired():
        v = both(nv("nvmlDeviceGetRetiredPages", _RETIRED_SBE), nv("nvmlDeviceGetRetiredPages", _RETIRED_DBE),
                 nv("nvmlDeviceGetRetiredPagesPendingStatus"))  # fmt: skip
        return v and {"single_bit": len(v[0]), "double_bit": len(v[1]), "pending": int(v[2])}

    def pcie():
        v = both(nv("nvmlDeviceGetCurrPcieLinkGeneration"), nv("nvmlDeviceGetMaxPcieLinkGeneration"),
                 nv("nvmlDeviceGetCurrPcieLinkWidth"), nv("nvmlDeviceGetMaxPcieLinkWidth"))  # fmt: skip
        return v and dict(zip(("gen", "max_gen", "width", "max_width"), (int(x) for x in v)))

    def clocks():
        v = both(nv("nvmlDeviceGetClockInfo", _CLOCK_SM), nv("nvmlDeviceGetMaxClockInfo", _CLOCK_SM),
                 nv("nvmlDeviceGetClockInfo", _CLOCK_MEM), nv("nvmlDeviceGetMaxClockInfo", _CLOCK_MEM))  # fmt: skip
        return v and dict(zip(("sm", "sm_max", "mem", "mem_max"), (int(x) for x in v)))

    def xids():
        pci = nv("nvmlDeviceGetPciInfo")
        bus = getattr(pci, "busId", None) if pci is not None else None
        if bus is None:
            return None
        return xids_for(kernel_log(), bus.decode() if isinstance(bus, bytes) else str(bus))

    for name, read in (("ecc_uncorrected", ecc), ("remap", remap), ("retired_pages", retired), ("pcie", pcie),
                       ("clocks_mhz", clocks), ("xids", xids)):  # fmt: skip
        take(name, read)
    return HealthFacts(**facts, unread=unread)


def _bus(pci: str) -> str:
    """'00000000:18:00.0' or '0000:18:00' -> '18:00' (bus:device), to match NVML against the log."""
    m = re.search(r"([0-9a-f]{2}):([0-9a-f]{2})(?:\.\d)?$", pci.strip().lower())
    return f"{m.group(1)}:{m.group(2)}" if m else pci.strip().lower()


def xids_for(log: str, bus_id: str) -> tuple[int, ...]:
    """XID codes the kernel log reports for the GPU at PCI ``bus_id``, in order. Pure."""
    want = _bus(bus_id)
    return tuple(int(code) for pci, code in _XID.findall(log) if _bus(pci) == want)


def read_kernel_log() -> str:
    """The kernel ring buffer: /dev/kmsg (non-blocking), else ``dmesg``; PermissionError when neither
    may be read (then the XID fact is unread, with that reason)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        fd = None
    if fd is not None:
        records = []
        try:
            while True:
                try:
                    records.append(os.read(fd, 8192).decode(errors="replace"))
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record was overwritten while reading; go on
                    continue
        finally:
            os.close(fd)
        return "\n".join(records)
    proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    if proc.returncode != 0:
        raise PermissionError(f"cannot read the kernel log (/dev/kmsg, dmesg: {proc.stderr.strip()[:100]})")
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# Judging (pure)


def judge_health(h: HealthFacts | None, gpu: int) -> list[CheckResult]:
    """One ``health.*`` result per fact for GPU ``gpu``."""
    if h is None:
        return [
            CheckResult(
                "health", "skip", "health not read: NVML unavailable (nvidia-smi fallback)", gpu=gpu, required=False
            )
        ]
    return [_judge(name, getattr(h, name), h.unread.get(name), gpu) for name in _RULES]


def _judge(name: str, value: Any, why: str | None, gpu: int) -> CheckResult:
    check = f"health.{_RULES[name][0]}"
    if value is None:
        return CheckResult(check, "skip", f"not read: {why or 'unknown reason'}", gpu=gpu, required=False)
    status, message = _RULES[name][1](value)
    return CheckResult(
        check, status, message, gpu=gpu, perf={"facts": value if not isinstance(value, tuple) else list(value)}
    )


def _ecc(v: dict[str, int]) -> tuple[str, str]:
    said = f"uncorrectable ECC errors: {v['volatile']} since boot, {v['aggregate']} lifetime"
    return ("fail" if v["volatile"] or v["aggregate"] else "pass"), said


def _remap(v: dict[str, int]) -> tuple[str, str]:
    said = f"row remaps: {v['corrected']} corrected, {v['uncorrected']} uncorrected"
    if v["failed"]:
        return "fail", f"row remap FAILED (the memory cannot be repaired): {said}"
    if v["pending"]:
        return "fail", f"pending row remap: reset the GPU to apply it; {said}"
    return "pass", said


def _retired(v: dict[str, int]) -> tuple[str, str]:
    said = f"retired pages: {v['single_bit']} single-bit, {v['double_bit']} double-bit"
    if v["pending"]:
        return "fail", f"pages pending retirement: reset the GPU to retire them; {said}"
    return "pass", said


def _pcie(v: dict[str, int]) -> tuple[str, str]:
    said = f"PCIe gen {v['gen']} x{v['width']} (max gen {v['max_gen']} x{v['max_width']})"
    if v["width"] < v["max_width"]:
        return "warn", f"PCIe link narrower than the maximum: {said}"
    return "pass", said + ("; a lower generation at idle is power saving" if v["gen"] < v["max_gen"] else "")


def _clocks(v: dict[str, int]) -> tuple[str, str]:
    said = f"SM {v['sm']}/{v['sm_max']} MHz, memory {v['mem']}/{v['mem_max']} MHz (current/max)"
    if v["sm_max"] <= 0 or v["mem_max"] <= 0:
        return "warn", f"the driver reports no maximum clock: {said}"
    return "pass", said  # an idle GPU runs below its maximum: throttling under load is perf.throttle's


def _xids(v: tuple[int, ...]) -> tuple[str, str]:
    if not v:
        return "pass", "no XID event for this GPU in the kernel log"
    bad = sorted(set(v) & BAD_XIDS)
    counts = Counter(v)  # an application fault repeats its XID (43) at every run: say each code once
    said = "XID events since boot: " + ", ".join(
        f"{x}" + (f" ({n} times)" if n > 1 else "") for x, n in sorted(counts.items())
    )
    if bad:
        return "fail", f"{said} (GPU fault: {', '.join(map(str, bad))})"
    return "warn", said


_RULES: dict[str, tuple[str, Callable[[Any], tuple[str, str]]]] = {
    "ecc_uncorrected": ("ecc", _ecc),
    "remap": ("remap", _remap),
    "retired_pages": ("retired_pages", _retired),
    "pcie": ("pcie", _pcie),
    "clocks_mhz": ("clocks", _clocks),
    "xids": ("xid", _xids),
}
