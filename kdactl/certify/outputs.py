"""What a certification leaves behind besides the certificate: JUnit XML (one testcase per check
per GPU), a node_exporter textfile-collector file (written atomically with the certificate, so the
collector never reads half a file), and the summary table."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from kdactl.certify.certificate import parse_stamp
from kdactl.results import STATUSES

_STATUS_STYLE = {"pass": "green", "fail": "bold red", "error": "red", "warn": "yellow", "skip": "dim"}


def _gpu_label(r: Mapping[str, Any]) -> str:
    gpu = r.get("gpu")
    return "node" if gpu is None else f"gpu{gpu}"


# ---------------------------------------------------------------------------------------------
# JUnit


def junit_xml(cert: Mapping[str, Any]) -> str:
    """JUnit XML that validates against the Jenkins JUnit schema (tests/data/jenkins-junit.xsd).

    One <testsuite> per GPU and one for node-level checks, named ``<host>.gpuN`` / ``<host>.node``
    with the host in ``hostname`` and in every classname (``kdactl.<host>.gpuN``), so that files of
    many nodes merged in one CI report never collide. fail -> <failure>, error -> <error>, skip ->
    <skipped>reason</skipped>. A warning is a passing testcase (status="warn") whose <system-out> says
    WARNING, listed again in its suite's <properties> and <system-out>; under ``--fail-on warn`` the
    certificate counts it as failed, and so does the file (<failure type="warn">)."""
    host = str(cert.get("node", {}).get("hostname", "") or "unknown-host")
    uuids = {g["index"]: g.get("uuid", "") for g in cert.get("gpus", [])}
    warn_fails = (cert.get("options") or {}).get("fail_on") == "warn"
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in cert.get("results", []):
        groups.setdefault(_gpu_label(r), []).append(r)
    root = ET.Element("testsuites", name=f"kdactl certify {host}")
    for label, results in groups.items():
        suite = ET.SubElement(
            root, "testsuite", name=f"{host}.{label}", hostname=host, timestamp=str(cert.get("issued_at", ""))
        )
        props = [("gpu_uuid", uuids.get(int(label[3:]), ""))] if label.startswith("gpu") else []
        warnings = [f"{r['check']}: {_xml_text(str(r.get('message') or ''))}" for r in results if r["status"] == "warn"]
        props += [("warnings", str(len(warnings)))] + [("warning", w) for w in warnings]
        properties = ET.SubElement(suite, "properties")
        for name, value in props:
            ET.SubElement(properties, "property", name=name, value=value)
        counts = {"tests": len(results), "failures": 0, "errors": 0, "skipped": 0}
        for r in results:
            _testcase(suite, f"kdactl.{host.replace('.', '_')}.{label}", r, counts, warn_fails)
        for k, v in counts.items():
            suite.set(k, str(v))
        suite.set("time", _seconds(sum(float(r.get("duration_s") or 0.0) for r in results)))
        if warnings:
            ET.SubElement(suite, "system-out").text = "".join(f"WARNING {w}\n" for w in warnings)
    for k in ("tests", "failures", "errors"):
        root.set(k, str(sum(int(s.get(k, "0")) for s in root)))
    root.set("time", _seconds(sum(float(s.get("time", "0")) for s in root)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _testcase(
    suite: ET.Element, classname: str, r: Mapping[str, Any], counts: dict[str, int], warn_fails: bool
) -> None:
    status, message = r["status"], _xml_text(str(r.get("message") or ""))
    case = ET.SubElement(suite, "testcase", classname=classname, name=_xml_text(str(r["check"])),
                         time=_seconds(float(r.get("duration_s") or 0.0)), status=status)  # fmt: skip
    if status == "fail" or (status == "warn" and warn_fails):
        counts["failures"] += 1
        ET.SubElement(case, "failure", message=message[:500], type=status).text = message
    elif status == "error":
        counts["errors"] += 1
        ET.SubElement(case, "error", message=message[:500], type="error").text = message
    elif status == "skip":
        counts["skipped"] += 1
        ET.SubElement(case, "skipped").text = message
    elif status == "warn":
        ET.SubElement(case, "system-out").text = f"WARNING: {message}"
    elif message:
        ET.SubElement(case, "system-out").text = f"{status}: {message}"


def _seconds(x: float) -> str:
    return f"{x:.3f}"


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """Text XML 1.0 can carry: a tool's colour codes or a stray NUL in a message would make the
    whole file unreadable to every JUnit parser."""
    return _NOT_XML.sub("\ufffd", text)


# ---------------------------------------------------------------------------------------------
# Prometheus textfile collector


def _esc(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kv: Any) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kv.items()) + "}"


def _num(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    # 15 significant digits: a unit conversion's last-bit noise (0.122028 ms is 0.00012202799999999999 s) stays out
    return f"{float(x):.15g}" if not float(x).is_integer() else str(int(x))


_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6}  # perf units -> Prometheus' base unit (a division rounds least)
_PROBLEMS = ("fail", "warn", "error")  # statuses exported per check; the rest only as counts


def prom_text(cert: Mapping[str, Any]) -> str:
    """node_exporter textfile format (passes ``promtool check metrics``): HELP and TYPE once per
    family, samples of a family together, base units. The series are bounded by the node, not by
    the suite: checks that passed or skipped are counted per status; only checks that failed,
    warned or errored get a series of their own, and perf one per GPU and gated shape."""
    node = cert.get("node", {}).get("hostname", "")
    uuids = {g["index"]: g.get("uuid", "") for g in cert.get("gpus", [])}
    families: list[tuple[str, str, list[tuple[str, float]]]] = []

    def family(name: str, help_: str, samples: Iterable[tuple[str, float]]) -> None:
        families.append((name, help_, list(samples)))

    expires = parse_stamp(cert.get("expires_at"))
    issued = parse_stamp(cert.get("issued_at"))
    verdict = cert.get("verdict")
    family("kdactl_info", "The last certification: kdactl version, verdict, scope, GPU SKUs and kernel targets (always 1).",
           [(_labels(node=node, **_info(cert)), 1.0)])  # fmt: skip
    family("kdactl_certified", "1 when the node's last certificate says certified, else 0.",
           [(_labels(node=node), 1.0 if verdict == "certified" else 0.0)])  # fmt: skip
    family("kdactl_cert_verdict", "The last certificate's verdict (1 for the verdict it has).",
           [(_labels(node=node, verdict=v), 1.0 if v == verdict else 0.0) for v in ("certified", "not_certified", "inconclusive")])  # fmt: skip
    family("kdactl_cert_issued_timestamp_seconds", "When the last certificate was issued (Unix time).",
           [(_labels(node=node), issued.timestamp() if issued else math.nan)])  # fmt: skip
    family("kdactl_cert_expiry_timestamp_seconds", "When the last certificate expires (Unix time).",
           [(_labels(node=node), expires.timestamp() if expires else math.nan)])  # fmt: skip
    results = cert.get("results", [])
    counts = {s: sum(1 for r in results if r.get("status") == s) for s in STATUSES}
    family("kdactl_check_results", "How many checks of the last certification ended with each status.",
           [(_labels(node=node, status=s), float(n)) for s, n in counts.items()])  # fmt: skip
    problems, perf = [], []
    for r in results:
        gpu_uuid = uuids.get(r.get("gpu"), "") if r.get("gpu") is not None else ""
        if r.get("status") in _PROBLEMS:
            problems.append((_labels(node=node, check=r["check"], gpu_uuid=gpu_uuid, status=r["status"]), 1.0))
        per = _PER_SECOND.get(str(r.get("unit")))
        if per is not None and isinstance(r.get("measured"), (int, float)):
            perf.append(
                (_labels(node=node, gpu_uuid=gpu_uuid, shape=r.get("shape", r["check"])), float(r["measured"]) / per)
            )
    family("kdactl_check_status", "1 for each check of the last certification that failed, warned or errored "
           "(gpu_uuid empty: node-level).", problems)  # fmt: skip
    family(
        "kdactl_perf_measured_seconds",
        "Median time of the auto route per gated shape (cold L2) in the last certification.",
        perf,
    )
    lines = []
    for name, help_, samples in families:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        lines += [f"{name}{labels} {_num(v)}" for labels, v in samples]
    return "\n".join(lines) + "\n"


def _info(cert: Mapping[str, Any]) -> dict[str, str]:
    """kdactl_info's labels: one value each, so several SKUs or targets on a node join with ','."""
    gpus = [g for g in cert.get("gpus") or [] if isinstance(g, dict)]

    def joined(key: str) -> str:
        return ",".join(sorted({str(g[key]) for g in gpus if g.get(key)}))

    versions = cert.get("versions") or {}
    return {"version": str(versions.get("kdactl") or ""), "verdict": str(cert.get("verdict") or ""),
            "scope": str(cert.get("scope") or ""), "sku": joined("sku"), "target": joined("target"),
            "driver": str(versions.get("driver") or "")}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Summary table


def summary_table(cert: Mapping[str, Any], show_passes: bool = True) -> Table:
    table = Table(title=f"kdactl certify: {cert.get('node', {}).get('hostname', '')}", show_lines=False)
    for col in ("where", "check", "status", "s", "message"):
        table.add_column(col, overflow="fold")
    for r in cert.get("results", []):
        if not show_passes and r["status"] == "pass":
            continue
        where = "node" if r.get("gpu") is None else f"gpu{r['gpu']}"
        style = _STATUS_STYLE.get(r["status"], "")
        table.add_row(where, str(r["check"]), f"[{style}]{r['status']}[/]", f"{float(r.get('duration_s') or 0):.1f}",
                      _plain(str(r.get("message") or ""))[:300])  # fmt: skip
    return table


def _plain(text: str) -> str:
    return text.replace("[", "\\[")


def render_summary(console: Console, cert: Mapping[str, Any], reason: str, paths: Mapping[str, Any]) -> None:
    console.print(summary_table(cert))
    verdict = cert.get("verdict", "?")
    style = {"certified": "bold green", "not_certified": "bold red"}.get(verdict, "bold yellow")
    console.print(f"[{style}]{verdict.upper()}[/]: {_plain(reason)}")
    console.print(f"expires {cert.get('expires_at')}; scope {cert.get('scope')}", markup=False)
    for label, path in paths.items():
        if path:
            console.print(f"{label}: {path}", markup=False)
