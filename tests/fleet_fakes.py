"""Certificates for the fleet tests: the real certify pipeline over fake H200 nodes (tests.certify_fakes),
with perf results, faults and hostnames chosen by the test."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.results import CheckResult
from tests import certify_fakes as cf

DATA = Path(__file__).resolve().parent / "data" / "certs"
NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=timezone.utc)  # after the recorded CPU certificates, before they expire


BASELINE_MS = {"B1-T4096-H8": 1.0, "B8-T2048-H32": 2.0}


def perf_stage(times: dict[str, float]):
    def run(job) -> list[CheckResult]:
        out = []
        for shape, ms in times.items():
            base = BASELINE_MS[shape]
            status = "pass" if ms <= base * 1.1 else "fail"
            out.append(CheckResult(f"perf[{shape}]", status, f"measured {ms} ms, baseline {base} ms",
                                   perf={"shape": shape, "measured": ms, "baseline": base, "threshold": base * 1.1, "unit": "ms"}))
        return out

    return run


def make_cert(tmp: Path, host: str, when: datetime = NOW, times: dict[str, float] | None = None, fault: str | None = None,
              gpus: int = 2, name: str | None = None, lifetime: float = 7.0) -> Path:
    """Run certify_command for a fake node ``host`` at time ``when``; returns the certificate's path."""
    runner = cf.fault_runner()
    runner.behaviours[("perf", None)] = perf_stage(times or dict(BASELINE_MS))
    env = {"KDACTL_FAULT": fault} if fault else {}
    s = cf.settings(tmp / host, **env)
    deps = replace(cf.deps(cf.node(gpus), runner, now=lambda: when), hostname=lambda: host)
    out = tmp / "certs" / (name or f"{host}-{when:%Y%m%dT%H%M%S}.json")
    certify_command(s, CertifyOptions(out=out, lifetime_days=lifetime), deps)
    return out


def tamper(path: Path) -> Path:
    doc = json.loads(path.read_text())
    doc["verdict"] = "certified" if doc["verdict"] != "certified" else "not_certified"
    out = path.with_name("tampered-" + path.name)
    out.write_text(json.dumps(doc, indent=2))
    return out


def after(days: float) -> datetime:
    return NOW + timedelta(days=days)


def recent() -> datetime:
    """An hour ago by the real clock: for tests whose ingest or report uses the clock."""
    return datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
