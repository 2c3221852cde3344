"""The fleet report as a rich table, markdown, JSON or a self-contained HTML page.

Every value printed is escaped for its format: the table prints cells as plain text (never rich
markup), markdown spells HTML's and markdown's special characters as entities or escapes (so a
hostname can carry neither a tag nor a link), HTML escapes everything. Values arrive bounded
(kdactl.fleet.text.clip); a problems cell is bounded again as a whole.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from kdactl.fleet.text import clip

PROBLEM_CELL_MAX = 1200
SUMMARY_COLS = (("SKU", "sku"), ("nodes", "nodes"), ("certified", "certified"), ("not certified", "not_certified"),
                ("inconclusive", "inconclusive"), ("expired", "expired"), ("expiring in 1 day", "expiring_1d"),
                ("CC", "cc"), ("SMs", "sm_count"), ("CUDA", "cuda"), ("target", "target"), ("suite passed", "suite"),
                ("sanitizer errors", "sanitizer"))  # fmt: skip
KIND_COLS = (("problem", "kind"), ("nodes", "nodes"))
PERF_COLS = (("SKU", "sku"), ("shape", "shape"), ("GPUs", "gpus"), ("measured", "measured"), ("baseline", "baseline"),
             ("measured/baseline", "ratio"))  # fmt: skip
PROBLEM_COLS = (("node", "node"), ("SKU", "sku"), ("severity", "severity"), ("issued", "issued_at"),
                ("expires", "expires_at"), ("problems", "problems"))  # fmt: skip
_MD_SPECIAL = frozenset("\\`*_[]|~")  # with [ ] escaped no ( ) can make a link
_MD_ENTITY = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _num(x: Any, unit: str = "") -> str:
    return "-" if x is None else f"{x:.4g} {unit}".strip()


def summary_cells(row: Mapping[str, Any]) -> dict[str, str]:
    san = "not run" if row["sanitizer_errors"] is None else f"{row['sanitizer_errors']} ({row['sanitizer_runs']} runs)"
    return {
        **{k: str(v) for k, v in row.items()},
        "suite": f"{row['suite_passed']}/{row['suite_total']}",
        "sanitizer": san,
    }


def perf_cells(row: Mapping[str, Any]) -> dict[str, str]:
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
    gpus = f"{row['shapes']} shapes" if row["shape"] == "geomean" else str(row["gpus"])
    return {"sku": row["sku"], "shape": row["shape"], "gpus": gpus, "measured": _num(row["measured"], row["unit"]),
            "baseline": _num(row["baseline"], row["unit"]), "ratio": ratio}  # fmt: skip


def problem_cells(row: Mapping[str, Any]) -> dict[str, str]:
    return {**{k: str(v) for k, v in row.items()}, "problems": clip("; ".join(row["problems"]), PROBLEM_CELL_MAX)}


def page_note(report: Any) -> str:
    if not report.problem_nodes:
        return "none"
    first, last = report.offset + 1, report.offset + len(report.problems)
    more = f"; --offset {last} for the next" if last < report.problem_nodes else ""
    shown = f"{first}-{last}" if report.problems else "none"
    return f"{shown} of {report.problem_nodes}, most severe first{more}"


def sections(report: Any) -> list[tuple[str, tuple, list[dict[str, str]]]]:
    left_out = [("Stored rows left out (not well-formed certificates)", (("row", "row"),),
                 [{"row": clip(line, PROBLEM_CELL_MAX)} for line in report.left_out])] if report.left_out else []  # fmt: skip
    return [
        ("Fleet summary per SKU (each node's latest certificate)", SUMMARY_COLS, [summary_cells(r) for r in report.summary]),
        ("Problems by kind (nodes whose latest certificate has it)", KIND_COLS,
         [{"kind": r["kind"], "nodes": str(r["nodes"])} for r in report.kinds]),
        ("Performance per SKU and shape (median over GPUs; measured/baseline > 1 is slower for times)", PERF_COLS,
         [perf_cells(r) for r in report.perf]),
        (f"Nodes not certified, expired, drifted or fault-injected: {page_note(report)}", PROBLEM_COLS,
         [problem_cells(r) for r in report.problems]),
    ] + left_out  # fmt: skip


def header(report: Any) -> str:
    since = f", issued since {report.since}" if report.since else ""
    return f"kdactl fleet report {report.generated_at}: {report.certificates} certificates, {report.nodes} nodes{since}"


def render(report: Any, console: Any, fmt: str) -> None:
    writers: dict[str, Callable[[Any], str]] = {"markdown": markdown, "html": html_page,
                                                "json": lambda r: json.dumps(r.to_json(), indent=2) + "\n"}  # fmt: skip
    if fmt in writers:
        console.file.write(writers[fmt](report))
        return
    console.print(Text(header(report)))
    for title, cols, rows in sections(report):
        table = Table(title=Text(title), title_justify="left")
        for name, _ in cols:
            table.add_column(Text(name), overflow="fold")
        for row in rows:
            table.add_row(*(Text(row[key]) for _, key in cols))
        if not rows:
            table.add_row("none", *([""] * (len(cols) - 1)))
        console.print(table)


def md(text: str) -> str:
    """Markdown that shows ``text`` as it is: no HTML, no emphasis, no link, no table break."""
    return "".join(_MD_ENTITY.get(ch) or ("\\" + ch if ch in _MD_SPECIAL else ch) for ch in text.replace("\n", " "))


def markdown(report: Any) -> str:
    lines = [f"# {md(header(report))}", ""]
    for title, cols, rows in sections(report):
        lines += [f"## {md(title)}", ""]
        if not rows:
            lines += ["none", ""]
            continue
        lines.append("| " + " | ".join(md(name) for name, _ in cols) + " |")
        lines.append("|" + "---|" * len(cols))
        lines += ["| " + " | ".join(md(row[key]) for _, key in cols) + " |" for row in rows]
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
