"""The compute-sanitizer payload: a smoke of every eligible route (fixed and varlen, with and
without state, fixed in both serving calls with their fused transforms (kdactl.smoke.SMOKE_CONFIGS), and varlen through a V-first
state pool with prefix checkpoints in fp16) and of the device self-test, each checked against its
reference.

Run by kdactl.sanitizer.run as ``compute-sanitizer --tool T ... python payload.py [--faults-lib SO]``.
Prints ``KDACTL-PAYLOAD-OK routes=<routes> kernels=<launches>`` only at the very end, when every
launch ran and matched; ``KDACTL-PAYLOAD-FAIL <why>`` (exit 1) when a result was wrong; and
``KDACTL-PAYLOAD-ERROR <why>`` (exit 3) when it could not finish. Problems are tiny and the fp64
reference runs on the CPU, because every device access is instrumented here.
Under KDACTL_FAULT=sanitizer it also launches the planted out-of-bounds write (memcheck must fail).
"""

from __future__ import annotations

import argparse
import sys

OK, FAIL, ERROR = "KDACTL-PAYLOAD-OK", "KDACTL-PAYLOAD-FAIL", "KDACTL-PAYLOAD-ERROR"
SELFTEST_N = 4097  # a partial last block, small enough for racecheck


def run(faults_lib: str | None) -> int:
    import torch

    from kdactl import faults
    from kdactl.jit.selftest import run_selftest
    from kdactl.kda import ROUTES
    from kdactl.kda.device import device_info, kernels

    if not torch.cuda.is_available():
        print(f"{ERROR} no CUDA GPU visible", flush=True)
        return 3
    device = torch.device("cuda", torch.cuda.current_device())
    lib, info = kernels(), device_info(device)
    wrong: list[str] = []
    selftest = run_selftest(lib, device.index, n=SELFTEST_N)
    if not selftest.passed:
        wrong.append(f"self-test: {selftest.mismatches} values wrong, first {selftest.first_mismatch}")
    ran = _route_smokes(info, device, wrong)
    launches = 1 + len(ran)
    if faults.wants_sanitizer_fault():
        from kdactl.sanitizer.faultlib import run_fault

        if not faults_lib:
            print(f"{ERROR} KDACTL_FAULT=sanitizer needs --faults-lib", flush=True)
            return 3
        run_fault(faults_lib, "oob")  # planted: memcheck must report it
        launches += 1
    if wrong:
        print(f"{FAIL} " + "; ".join(wrong), flush=True)
        return 1
    missing = [r for r in ROUTES if r not in ran]
    if missing:
        print(f"{ERROR} routes never eligible on the payload's problems: {', '.join(missing)}", flush=True)
        return 3
    print(f"{OK} routes={','.join(dict.fromkeys(ran))} kernels={launches}", flush=True)
    return 0


def _route_smokes(info, device, wrong: list[str]) -> list[str]:
    """Every eligible route on every payload row, fixed and varlen, with and without state.
    Appends a line per wrong result to ``wrong``; returns the route of every smoke that ran."""
    from kdactl.kda import ROUTES
    from kdactl.smoke import (
        PAYLOAD_ROWS,
        SMOKE_CONFIGS,
        ineligible_reason,
        pool_ineligible_reason,
        run_pool_smoke,
        run_smoke,
    )

    ran = []
    for row in PAYLOAD_ROWS:
        for route in ROUTES:
            for varlen in (False, True):
                for state in (False, True):
                    if ineligible_reason(route, row, varlen, info) is not None:
                        continue
                    result = run_smoke(route, row, varlen, state, device, ref_device="cpu")
                    ran.append(route)
                    if not result.ok:
                        wrong.append(f"{row.name} {'varlen' if varlen else 'fixed'} state={state}: {result.describe()}")
            for config in SMOKE_CONFIGS if ineligible_reason(route, row, False, info) is None else ():
                result = run_smoke(route, row, False, True, device, ref_device="cpu", config=config)  # fused loads
                ran.append(route)
                if not result.ok:
                    wrong.append(f"{row.name} {config}: {result.describe()}")
            if pool_ineligible_reason(route, row, info) is None:  # the state pool's and checkpoints' accesses
                result = run_pool_smoke(route, row, device, ref_device="cpu")
                ran.append(route)
                if not result.ok:
                    wrong.append(f"{row.name} pool: {result.describe()}")
    return ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults-lib", default=None, help="libkdactl_faults.so (for KDACTL_FAULT=sanitizer)")
    args = parser.parse_args(argv)
    try:
        return run(args.faults_lib)
    except Exception as err:  # noqa: BLE001 - any failure is "could not finish", never the sentinel
        print(f"{ERROR} {type(err).__name__}: {' '.join(str(err).split())[:400]}", flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
