"""The kdactl command line. Each command declares options, calls one domain function, and
leaves rendering and the exit code to ``_run``."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from kdactl.errors import EXIT_INCONCLUSIVE, KdactlError
from kdactl.report import Report, emit, emit_error
from kdactl.settings import Settings

app = typer.Typer(
    name="kdactl",
    help="Certify GPU nodes for KDA prefill: detect, build, validate, sanitize, benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON document on stdout.")


def _run(as_json: bool, action: Callable[[Settings], Report]) -> None:
    """Run a command body; map its result or error to output and the SPEC exit code."""
    try:
        report = action(Settings.from_env())
    except KdactlError as err:
        emit_error(str(err), err.exit_code, as_json)
        raise typer.Exit(err.exit_code) from None
    except Exception as err:  # noqa: BLE001 - SPEC: any exception ends as 3 with one line
        emit_error(f"internal error: {type(err).__name__}: {err}", EXIT_INCONCLUSIVE, as_json)
        raise typer.Exit(EXIT_INCONCLUSIVE) from None
    emit(report, as_json)
    raise typer.Exit(report.exit_code)


@app.command()
def detect(as_json: bool = JsonOpt) -> None:
    """Report the node's GPUs, driver, CUDA versions and the kernel target chosen."""
    from kdactl.node import detect_node

    _run(as_json, detect_node)


@app.command()
def build(
    target: Optional[str] = typer.Option(
        None, "--target", help="Comma-separated targets (sm_90a,sm_100f,...): compile only, no GPU needed."
    ),
    aot: Optional[Path] = typer.Option(None, "--aot", help="Write a relocatable AOT bundle with a manifest here."),
    as_json: bool = JsonOpt,
) -> None:
    """Build (JIT, cached) or load (AOT) the kernel library for this node, and run its self-test."""
    from kdactl.jit.command import build_command

    _run(as_json, lambda s: build_command(s, targets=target, aot_dir=aot))


def main() -> None:
    app()
