"""The fleet report as a rich table, markdown, JSON or a self-contained HTML page."""

from __future__ import annotations

import html
import json
from typing import Any, Callable, Mapping

from rich.table import Table

QUAL_COLS = (("SKU", "sku"), ("CC", "cc"), ("SMs", "sm_count"), ("CUDA", "cuda"), ("target", "target"),
             ("suite passed", "suite"), ("sanitizer errors", "sanitizer"), ("nodes certified", "nodes"))  # fmt: skip
PERF_COLS = (("SKU", "sku"), ("shape", "shape"), ("GPUs", "gpus"), ("measured", "measured"), ("baseline", "baseline"),
             ("measured/baseline", "ratio"))  # fmt: skip
PROBLEM_COLS = (("node", "node"), ("SKU", "sku"), ("verdict", "verdict"), ("expires", "expires_at"), ("problems", "problems"))


def _num(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:.4g} {unit}".strip()


def qual_cells(row: Mapping[str, Any]) -> dict[str, str]:
    san = "not run" if row["sanitizer_errors"] is None else f"{row['sanitizer_errors']} ({row['sanitizer_runs']} runs)"
    return {**{k: str(v) for k, v in row.items()}, "suite": f"{row['suite_passed']}/{row['suite_total']}",
            "sanitizer": san, "nodes": f"{row['nodes_certified']}/{row['nodes_total']}"}  # fmt: skip


def perf_cells(row: Mapping[str, Any]) -> dict[str, str]:
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
    gpus = f"{row['shapes']} shapes" if row["shape"] == "geomean" else str(row["gpus"])
    return {"sku": row["sku"], "shape": row["shape"], "gpus": gpus, "measured": _num(row["measured"], row["unit"]),
            "baseline": _num(row["baseline"], row["unit"]), "ratio": ratio}  # fmt: skip


def problem_cells(row: Mapping[str, Any], sep: str = "; ") -> dict[str, str]:
    return {**{k: str(v) for k, v in row.items()}, "problems": sep.join(row["problems"])}


def sections(report: Any) -> list[tuple[str, tuple, list[dict[str, str]]]]:
    left_out = [("Stored rows left out (not well-formed certificates)", (("row", "row"),),
                 [{"row": line} for line in report.left_out])] if report.left_out else []  # fmt: skip
    return left_out + [
        ("Qualification per SKU (each node's latest certificate)", QUAL_COLS, [qual_cells(r) for r in report.qualification]),
        ("Performance per SKU and shape (median over GPUs; measured/baseline > 1 is slower for times)", PERF_COLS,
         [perf_cells(r) for r in report.perf]),
        ("Nodes failed, inconclusive, expired or drifted", PROBLEM_COLS, [problem_cells(r) for r in report.problems]),
    ]  # fmt: skip


def header(report: Any) -> str:
    since = f", issued since {report.since}" if report.since else ""
    return f"kdactl fleet report {report.generated_at}: {report.certificates} certificates, {report.nodes} nodes{since}"


def render(report: Any, console: Any, fmt: str) -> None:
    writers: dict[str, Callable[[Any], str]] = {"markdown": markdown, "html": html_page,
                                                "json": lambda r: json.dumps(r.to_json(), indent=2) + "\n"}  # fmt: skip
    if fmt in writers:
        console.file.write(writers[fmt](report))
        return
    console.print(header(report), markup=False)
    for title, cols, rows in sections(report):
        table = Table(title=title, title_justify="left")
        for name, _ in cols:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*(row[key].replace("[", "\\[") for _, key in cols))
        if not rows:
            table.add_row("none", *([""] * (len(cols) - 1)))
        console.print(table)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(report: Any) -> str:
    lines = [f"# {header(report)}", ""]
    for title, cols, rows in sections(report):
        lines += [f"## {title}", ""]
        if not rows:
            lines += ["none", ""]
            continue
        lines.append("| " + " | ".join(name for name, _ in cols) + " |")
        lines.append("|" + "---|" * len(cols))
        lines += ["| " + " | ".join(_md_cell(row[key]) for _, key in cols) + " |" for row in rows]
        lines.append("")
    return "\n".join(lines)


_CSS = "body{font-family:sans-serif}table{border-collapse:collapse;margin-bottom:1.5em}" \
       "td,th{border:1px solid #999;padding:2px 6px;text-align:left;vertical-align:top}"  # fmt: skip


def html_page(report: Any) -> str:
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8">', f"<title>{esc(header(report))}</title>",
           f"<style>{_CSS}</style></head><body>", f"<h1>{esc(header(report))}</h1>"]  # fmt: skip
    for title, cols, rows in sections(report):
        out.append(f"<h2>{esc(title)}</h2>")
        if not rows:
            out.append("<p>none</p>")
            continue
        out.append("<table><tr>" + "".join(f"<th>{esc(name)}</th>" for name, _ in cols) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{esc(row[key])}</td>" for _, key in cols) + "</tr>" for row in rows]
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
