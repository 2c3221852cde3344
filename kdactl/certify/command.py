"""``kdactl certify``: gather the node once, run every check (orchestrate), decide the verdict
(kdactl.results.verdict), write the certificate, the JUnit and the textfile, and report.

Where the certificate goes: ``--out``, else ``<data_dir>/cert.json`` (the one ``kdactl gate``
reads). A ``--quick`` run writes ``<data_dir>/cert-quick.json`` instead, so that a quick check never
replaces the full certificate the gate relies on.
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from kdactl import __version__
from kdactl.atomic import write_texts_atomic
from kdactl.certify import certificate as cert_mod
from kdactl.certify import fingerprint as fp
from kdactl.certify.orchestrate import (
    GpuJob,
    Progress,
    StageRunner,
    StderrProgress,
    SubprocessRunner,
    health_checks,  # fmt: skip
    node_checks,
    parse_gpus,
    run_gpus,
    select_gpus,
    target_checks,
)
from kdactl.certify.outputs import junit_xml, prom_text, render_summary
from kdactl.certify.signing import NodeSigner, read_signer
from kdactl.certify.stages import Plan, default_plan
from kdactl.errors import UsageError
from kdactl.faults import fault_from_env
from kdactl.hw.driver import version_str
from kdactl.results import VERDICT_EXIT, CheckResult, verdict
from kdactl.settings import Settings

LOG_PREFIX = "certify-logs-"
# The node's name where the hostname is not it (a pod's hostname is the pod's name): the DaemonSet sets
# it to the Kubernetes node name, which is what dcgm-exporter's Hostname label and kubectl name the node.
NODE_NAME_VAR = "KDACTL_NODE_NAME"
KEEP_LOG_DIRS = 5  # newest worker-log folders kept beside the certificate; older ones are removed


@dataclass(frozen=True)
class CertifyOptions:
    gpus: str = "all"
    expect_gpus: int | None = None
    expect_sku: str | None = None
    quick: bool = False
    out: Path | None = None
    junit: Path | None = None
    prom: Path | None = None
    lifetime_days: float = cert_mod.DEFAULT_LIFETIME_DAYS
    fail_on: str | None = None  # "warn"
    key_file: Path | None = None
    signing_key: Path | None = None  # this node's Ed25519 private key (PEM)
    as_json: bool = False


@dataclass
class Deps:
    """Everything certify reads from the world; tests replace any of them."""

    gather: Callable[[Settings], Any] | None = None  # -> NodeFacts
    runner: StageRunner | None = None  # default: SubprocessRunner (one worker process per stage)
    plan: Plan | None = None  # default: stages.default_plan(quick)
    progress: Progress | None = None
    now: Callable[[], datetime] = cert_mod.now_utc
    hostname: Callable[[], str] = socket.gethostname
    sanitizer_version: Callable[[Settings], str | None] | None = None
    artifacts: Callable[[Settings, set[str]], tuple[dict, dict]] = fp.artifacts_for  # type: ignore[assignment]


@dataclass
class CertifyReport:
    cert: dict[str, Any]
    reason: str
    paths: dict[str, str | None]
    exit_code: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"command": "certify", "verdict": self.cert["verdict"], "reason": self.reason,
                "exit_code": self.exit_code, "files": self.paths, "certificate": self.cert}  # fmt: skip

    def render(self, console: Console) -> None:
        render_summary(console, self.cert, self.reason, self.paths)


@dataclass(frozen=True)
class Checked:
    """The options, checked: what certify runs with."""

    picked: tuple[int, ...] | None  # GPU indices, None for all
    key: bytes | None  # HMAC key
    signer: NodeSigner | None  # this node's Ed25519 key
    out_path: Path


def check_options(o: CertifyOptions, settings: Settings) -> Checked:
    """Every usage error (exit 2) before the node is touched: a signing key that cannot be used
    included, so a run of many minutes does not end without a certificate."""
    picked = parse_gpus(o.gpus)
    if o.expect_gpus is not None and o.expect_gpus < 1:
        raise UsageError(f"--expect-gpus must be at least 1, got {o.expect_gpus}")
    if o.fail_on not in (None, "warn"):
        raise UsageError(f"--fail-on takes 'warn', got {o.fail_on!r}")
    if o.expect_sku is not None:
        _check_sku(o.expect_sku)
    fault_from_env(settings.env)
    cert_mod.lifetime(o.lifetime_days)
    out_path = Path(o.out) if o.out else settings.data_dir / ("cert-quick.json" if o.quick else "cert.json")
    _check_outputs({"--out": out_path, "--junit": o.junit, "--prom": o.prom})
    signer = read_signer(settings.env, o.signing_key)
    return Checked(picked, cert_mod.read_key(settings.env, o.key_file), signer, out_path)


def _check_outputs(paths: dict[str, Path | None]) -> None:
    """Every output can be written, checked before the run: one that cannot would otherwise fail
    only after a run of many minutes, with nothing to show for it."""
    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        cert_mod.check_writable(Path(path), option)
        resolved = Path(path).resolve()
        if resolved in seen:
            raise UsageError(f"{seen[resolved]} and {option} both name {path}; give each output its own file")
        seen[resolved] = option


def _check_sku(sku: str) -> None:
    from kdactl.skus import SKU_NAMES

    if sku not in SKU_NAMES:
        raise UsageError(f"--expect-sku {sku!r} is not a SKU kdactl knows ({', '.join(sorted(SKU_NAMES))})")


def certify_command(settings: Settings, o: CertifyOptions, deps: Deps | None = None) -> CertifyReport:
    d = deps or Deps()
    checked = check_options(o, settings)
    picked, out_path = checked.picked, checked.out_path
    facts = (d.gather or _gather)(settings)
    gpus = select_gpus(facts.gpus, picked)
    results = node_checks(facts, o.expect_gpus, o.expect_sku) + target_checks(gpus) + health_checks(gpus)
    plan = d.plan or default_plan(o.quick)
    jobs = [GpuJob(g.index, g.uuid, g.target, g.sku, o.quick, settings.env) for g in gpus if g.target]
    log_dir = _log_dir(out_path) if jobs and d.runner is None else None  # no worker runs, no log folder
    runner = d.runner or SubprocessRunner(log_dir or out_path.parent)
    results += run_gpus(jobs, plan, runner, d.progress or StderrProgress())
    results += fault_guard(settings.env, results, o.fail_on == "warn")
    name, reason = verdict(results, fail_on_warn=o.fail_on == "warn")
    targets = {g.target for g in gpus if g.target}
    artifacts, why_none = d.artifacts(settings, targets)
    doc = build_document(settings, facts, gpus, results, name, reason, o, d, artifacts, why_none)
    doc["options"]["fault"] = settings.env.get("KDACTL_FAULT") or None
    doc = cert_mod.seal(doc, checked.key, checked.signer)
    paths = _write_all(doc, out_path, o)
    paths["logs"] = str(log_dir) if log_dir else None
    return CertifyReport(doc, reason, paths, VERDICT_EXIT[name])


def _gather(settings: Settings) -> Any:
    from kdactl.node import gather_node

    return gather_node(settings)


def _log_dir(out_path: Path) -> Path:
    """A new folder for this run's worker logs beside the certificate (the operator reads them when
    a check fails). Only the newest KEEP_LOG_DIRS are kept: certify runs from provisioning and cron."""
    parent = out_path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        new = Path(
            tempfile.mkdtemp(prefix=f"{LOG_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-", dir=parent)
        )
    except OSError as err:
        raise UsageError(f"cannot create a log folder in {parent}: {err.strerror or err}") from None
    older = sorted((p for p in parent.glob(f"{LOG_PREFIX}*") if p.is_dir() and p != new),
                   key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)  # fmt: skip
    for stale in older[KEEP_LOG_DIRS - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)
    return new


def build_document(settings: Settings, facts: Any, gpus: tuple[Any, ...], results: list[CheckResult], name: str,
                   reason: str, o: CertifyOptions, d: Deps, artifacts: dict, why_none: dict) -> dict[str, Any]:  # fmt: skip
    issued = d.now()
    tk = facts.toolkit
    node_fp = fp.Fingerprint(
        tuple(g.uuid for g in facts.gpus), facts.driver_version, tk.version_str if tk else None, artifacts
    )
    sanitizer = (d.sanitizer_version or sanitizer_version)(settings)
    return {
        "schema": cert_mod.SCHEMA,
        "verdict": name,
        "reason": reason,
        "scope": "quick" if o.quick else "full",
        "issued_at": cert_mod.stamp(issued),
        "expires_at": cert_mod.stamp(issued + cert_mod.lifetime(o.lifetime_days)),
        "node": {
            "hostname": settings.env.get(NODE_NAME_VAR) or d.hostname(),
            "host_arch": facts.host_arch or platform.machine(),
            "fingerprint": node_fp.to_json(),
            "gpus_on_node": len(facts.gpus),
            "error": facts.error,
            "warnings": list(facts.warnings),
        },  # fmt: skip
        "options": {
            "gpus": o.gpus,
            "expect_gpus": o.expect_gpus,
            "expect_sku": o.expect_sku,
            "quick": o.quick,
            "fail_on": o.fail_on,
        },  # fmt: skip
        "versions": {
            "kdactl": __version__,
            "driver": facts.driver_version,
            "cuda_driver": version_str(facts.cuda_driver),
            "cuda_toolkit": tk.version_str if tk else None,
            "torch": facts.torch_version,
            "compute_sanitizer": sanitizer,
        },  # fmt: skip
        "gpus": [_gpu_doc(g, artifacts, why_none) for g in gpus],
        "results": [_result_doc(r) for r in results],
    }


def fault_guard(env: Any, results: list[CheckResult], fail_on_warn: bool) -> list[CheckResult]:
    """A run with KDACTL_FAULT set is a test of the pipeline: it must never end certified. If no
    check caught the injected fault, say so (error: the run proves nothing about the node)."""
    fault = env.get("KDACTL_FAULT")
    if not fault or verdict(results, fail_on_warn=fail_on_warn)[0] != "certified":
        return []
    return [CheckResult("fault_injection", "error", f"KDACTL_FAULT={fault} was injected but no check caught it: "
                        "the pipeline missed a planted fault")]  # fmt: skip


def _gpu_doc(g: Any, artifacts: dict, why_none: dict) -> dict[str, Any]:
    art = artifacts.get(g.target)
    return {"index": g.index, "uuid": g.uuid, "name": g.name, "sku": g.sku, "cc": version_str(g.cc),
            "sm_count": g.sm_count, "target": g.target, "artifact_sha256": art and art.sha256, "artifact_build": art and art.build,
            **({"health": g.health.to_json()} if getattr(g, "health", None) is not None else {}),
            **({"artifact_note": why_none[g.target]} if g.target in why_none else {})}  # fmt: skip


def _result_doc(r: CheckResult) -> dict[str, Any]:
    out = r.to_json()
    out["duration_s"] = round(float(out.get("duration_s") or 0.0), 3)
    return out


def sanitizer_version(settings: Settings) -> str | None:
    """compute-sanitizer's version line (found as kdactl sanitize finds it), or None."""
    from kdactl.errors import KdactlError
    from kdactl.sanitizer.run import find_sanitizer

    try:
        proc = subprocess.run([find_sanitizer(settings), "--version"], capture_output=True, text=True, timeout=30)
    except (KdactlError, OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if "version" in ln.lower()]
    return lines[-1] if lines else None


def _write_all(doc: dict[str, Any], out_path: Path, o: CertifyOptions) -> dict[str, str | None]:
    """All outputs or none; the certificate, which gate and provisioning act on, is renamed last."""
    files = {Path(p): text(doc) for p, text in ((o.junit, junit_xml), (o.prom, prom_text)) if p}
    files[out_path] = cert_mod.certificate_text(doc)
    try:
        write_texts_atomic(files)
    except OSError as err:
        raise UsageError(
            f"cannot write {err.filename or out_path}: {err.strerror or err}; no output was changed"
        ) from None
    return {
        "certificate": str(out_path),
        "junit": str(o.junit) if o.junit else None,
        "prom": str(o.prom) if o.prom else None,
    }
