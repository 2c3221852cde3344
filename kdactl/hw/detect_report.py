"""``kdactl detect``'s Report: the node facts as one JSON document, or a table for people."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kdactl.emit import stderr_console
from kdactl.errors import EXIT_INCONCLUSIVE, EXIT_PASS
from kdactl.hw.driver import version_str
from kdactl.hw.facts import NodeFacts

SCHEMA = "kdactl.detect/v1"


@dataclass(frozen=True)
class DetectReport:
    facts: NodeFacts

    @property
    def reason(self) -> str | None:
        """Why detect is inconclusive (exit 3): no GPU, or a GPU without a kernel target."""
        if self.facts.error:
            return self.facts.error
        if not self.facts.gpus:
            return "no NVIDIA GPU found"
        missing = [g for g in self.facts.gpus if g.target is None]
        if missing:
            return "; ".join(f"GPU {g.index} ({g.name}): no kernel target: {g.target_reason}" for g in missing)
        return None

    @property
    def exit_code(self) -> int:
        return EXIT_INCONCLUSIVE if self.reason else EXIT_PASS

    def to_json(self) -> dict[str, Any]:
        doc = {"schema": SCHEMA, **self.facts.to_json()}
        doc["error"] = self.reason
        doc["exit_code"] = self.exit_code
        return doc

    def render(self, console: Console) -> None:
        f = self.facts
        for label, value in _node_lines(f):
            console.print(f"[bold]{label:<13}[/bold] {escape(value)}")
        if f.gpus:
            console.print(_gpu_table(f))
        for w in f.warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}")
        if self.reason:
            stderr_console().print(f"kdactl: {self.reason}", markup=False)


def _node_lines(f: NodeFacts) -> list[tuple[str, str]]:
    tk = f.toolkit
    driver = (
        "none"
        if f.driver_version is None
        else f"{f.driver_version} (CUDA {version_str(f.cuda_driver) or '?'}, via {f.driver_source})"
    )
    torch = (
        "not importable" if f.torch_version is None else f"{f.torch_version} (CUDA {f.torch_cuda or 'none: CPU build'})"
    )
    lines = [
        ("host arch", f.host_arch),
        ("driver", driver),
        ("CUDA toolkit", "none (nvcc not found)" if tk is None else f"{tk.version_str} ({tk.nvcc})"),
        ("torch", torch),
    ]
    if f.cuda_arch_override:
        lines.append(("override", f"KDACTL_CUDA_ARCH={f.cuda_arch_override}"))
    if f.gpus:
        lines.append(("target", f.target or "per GPU, see table"))
    return lines


def _gpu_table(f: NodeFacts) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for col in ("GPU", "SKU", "CC", "SMs", "memory", "L2", "MIG", "ECC", "target", "name"):
        t.add_column(col, no_wrap=col != "name", min_width=12 if col == "name" else None)  # uuids: --json
    for g in f.gpus:
        t.add_row(
            str(g.index),
            g.sku if g.sku != "unknown" else "[yellow]unknown[/yellow]",
            version_str(g.cc),
            _or_dash(g.sm_count),
            f"{g.memory_mib / 1024:.1f} GiB",
            "-" if g.l2_bytes is None else f"{g.l2_bytes / (1 << 20):g} MiB",
            _on_off(g.mig),
            _on_off(g.ecc),
            g.target or "[red]none[/red]",
            escape(g.name),
        )
    return t


def _on_off(mode: str | None) -> str:
    return {"enabled": "on", "disabled": "off"}.get(mode or "", "-")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)
