"""The ``kdactl`` console script. ``kdactl gate`` runs every few minutes on every node (Slurm
HealthCheckProgram, Prolog, a readiness probe), and parsing through typer costs more than the
gate itself (typer builds pydantic adapters for every option: two thirds of gate's time on a CPU).
So a plain ``kdactl gate [--json] [--cert F] [--key-file F] [--trusted-keys F]`` is parsed here and runs the same
command body; anything else (``--help``, a typo, every other command) goes to the typer app, which
answers it as it always did."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

_GATE_PATHS = {"--cert": "cert", "--key-file": "key_file", "--trusted-keys": "trusted_keys"}


def gate_args(argv: Sequence[str]) -> dict | None:
    """``gate``'s options as gate_command's arguments, or None where typer must answer (anything
    but the plain form: help, unknown or repeated options, a missing or empty value)."""
    if not argv or argv[0] != "gate":
        return None
    out: dict = {"as_json": False}
    rest = list(argv[1:])
    while rest:
        token = rest.pop(0)
        name, eq, value = token.partition("=")
        if token == "--json" and not out["as_json"]:
            out["as_json"] = True
        elif name in _GATE_PATHS and _GATE_PATHS[name] not in out:
            if not eq:
                value = rest.pop(0) if rest else ""
            if not value or value.startswith("-"):
                return None
            out[_GATE_PATHS[name]] = Path(value)
        else:
            return None
    return out


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = gate_args(argv)
    if args is None:
        from kdactl.cli import main as typer_main

        typer_main(argv)
        return
    from kdactl.certify.gate import gate_command
    from kdactl.emit import PlainConsole, run_report

    as_json = args.pop("as_json")
    sys.exit(
        run_report(
            lambda s: gate_command(s, args.get("cert"), args.get("key_file"), args.get("trusted_keys")),
            as_json,
            "gate",
            PlainConsole,  # gate's report is plain lines
        )
    )
