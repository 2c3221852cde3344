"""One stage on one GPU, in its own process: ``python -m kdactl.certify.worker --impl MOD:FN ...``.

The orchestrator starts it with CUDA_VISIBLE_DEVICES set to the GPU, a time limit, and a result
file. The worker writes ``{"results": [...]}`` there and exits 0; anything the stage raises becomes
one ``error`` result. A crash or a kill leaves no result file: the orchestrator reports that.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from pathlib import Path

from kdactl.atomic import write_text_atomic
from kdactl.certify.stages import StageContext, error
from kdactl.proc import end_children_on_term
from kdactl.settings import Settings


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kdactl.certify.worker")
    p.add_argument("--stage", required=True)
    p.add_argument("--impl", required=True, help="module:function")
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--target", default="")
    p.add_argument("--sku", default="unknown")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--result", type=Path, required=True)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    ctx = StageContext(Settings.from_env(), args.gpu, args.target, args.sku, args.quick)
    start = time.monotonic()
    try:
        module, _, name = args.impl.partition(":")
        fn = getattr(importlib.import_module(module), name)
        # Nothing but the result file carries results: library prints go to the log (stderr).
        with contextlib.redirect_stdout(sys.stderr):
            results = list(fn(ctx))
    except Exception as err:  # noqa: BLE001 - the stage's error becomes its result
        text = f"{type(err).__name__}: {err}".strip().splitlines()[0]
        results = [error(args.stage, f"stage {args.stage} raised {text}", duration_s=time.monotonic() - start)]
    return [r.to_json() for r in results]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    end_children_on_term()  # a timeout or Ctrl-C of certify ends the suite's pytest and the sanitizers too
    payload = {"results": run(args)}
    write_text_atomic(args.result, json.dumps(payload, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
