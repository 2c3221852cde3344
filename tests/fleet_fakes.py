"""Certificates for the fleet tests: the real certify pipeline over fake H200 nodes (tests.certify_fakes),
with perf results, faults and hostnames chosen by the test."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

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


def resealed(source: Path, out: Path, change) -> Path:
    """``source`` changed by ``change(doc)`` and sealed again: digest-valid, whatever its content."""
    from kdactl.certify import certificate as cm

    doc = json.loads(source.read_text())
    doc.pop("integrity")
    change(doc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(cm.seal(doc, None), indent=2, allow_nan=True))
    return out


# --- the store under test: a SQLite file, or a schema of its own on a real PostgreSQL server ------

PG_ENV = "KDACTL_TEST_PG_URL"  # set by .ci/run, which starts the server


def postgres_url() -> str:
    """The test server's URL; in CI (CI=true, or KDACTL_REQUIRE_POSTGRES=1 as .ci/run sets) a missing
    server or psycopg fails, elsewhere it skips."""
    import os

    import pytest

    url = os.environ.get(PG_ENV)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        url = None
    if not url:
        why = f"no PostgreSQL for the fleet store tests ({PG_ENV} unset or psycopg missing; .ci/run starts one)"
        if os.environ.get("CI") == "true" or os.environ.get("KDACTL_REQUIRE_POSTGRES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return url


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards."""
    import uuid

    import psycopg

    url = postgres_url()
    name = f"kdactl_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@contextmanager
def store_target(backend: str, tmp: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield str(tmp / "f.db")
    else:
        with postgres_schema() as url:
            yield url
