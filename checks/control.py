"""A compute-sanitizer positive control: run one planted fault from libkdactl_faults.so.

Run by kdactl.sanitizer.run as ``compute-sanitizer --tool T ... python control.py --lib SO --fault F``
before the payload; the tool is trusted only if it reports the fault. No torch: starts at once.
Prints ``KDACTL-CONTROL-RAN fault=F launched=0|1 rc=N``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path of libkdactl_faults.so")
    parser.add_argument("--fault", required=True, help="oob | barrier | race | uninit")
    args = parser.parse_args(argv)
    try:
        from kdactl.sanitizer.faultlib import run_fault

        rc, launched = run_fault(args.lib, args.fault)
    except Exception as err:  # noqa: BLE001 - reported, and the control then counts as not caught
        print(f"KDACTL-CONTROL-ERROR fault={args.fault} {type(err).__name__}: {err}", flush=True)
        return 3
    print(f"KDACTL-CONTROL-RAN fault={args.fault} launched={int(launched)} rc={rc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
