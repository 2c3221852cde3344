"""Wall time of ``kdactl gate`` as Slurm and a readiness probe run it: a fresh process each time.

    python3 tools/bench_gate.py              # this node's own certificate and environment (a GPU node)
    python3 tools/bench_gate.py --fake -n 30 # a fake 8-GPU certificate in a temporary data dir (any machine)
    python3 tools/bench_gate.py --fake --signed  # the same, node-signed, gate given the trusted key

Prints the median, min and max of N runs (after one untimed run that warms the page cache), the
exit codes seen, and the gate's first line. ``--cmd`` times another command line instead (e.g.
``--cmd "python3 -X importtime -m kdactl gate"``). A benchmark, not a test: the time depends on the
machine and its load; tests/test_gate_startup.py checks what gate imports instead."""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_certificate(tmp: Path, signed: bool) -> dict[str, str]:
    """A certified 8-GPU H200 certificate issued now, through the real certify pipeline over the
    tests' fakes: the environment that makes ``kdactl gate`` read it (and, ``signed``, check its
    node signature against a trusted-keys file)."""
    sys.path.insert(0, str(ROOT))
    from kdactl.certify import certificate as cm
    from kdactl.certify.command import CertifyOptions, certify_command
    from tests import certify_fakes as cf

    env = {"KDACTL_CERT_KEY": ""}
    if signed:
        from kdactl.certify import signing
        from kdactl.certify.keygen import keygen_command

        line = keygen_command(cf.settings(tmp), tmp / "node.pem", "node-a").trusted_line  # the fakes' host
        (tmp / "trusted-keys").write_text(line + "\n")
        env |= {signing.SIGNING_ENV: str(tmp / "node.pem"), signing.TRUSTED_ENV: str(tmp / "trusted-keys")}
    s = cf.settings(tmp, **env)
    certify_command(s, CertifyOptions(), cf.deps(cf.node(8), now=cm.now_utc))
    return {**env, "KDACTL_DATA_DIR": str(s.data_dir), "KDACTL_CACHE_DIR": str(s.cache_dir)}


def time_runs(cmd: list[str], env: dict[str, str], n: int) -> tuple[list[float], set[int], str]:
    subprocess.run(cmd, env=env, capture_output=True, timeout=60)  # warm the page cache
    times, codes, first = [], set(), ""
    for _ in range(n):
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        times.append(time.perf_counter() - start)
        codes.add(proc.returncode)
        first = first or next(iter((proc.stdout + proc.stderr).strip().splitlines()), "")
    return times, codes, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=20, help="timed runs (default 20)")
    ap.add_argument("--fake", action="store_true", help="a fake 8-GPU certificate in a temporary data dir")
    ap.add_argument("--signed", action="store_true", help="with --fake: node-signed, and gate checks the signature")
    ap.add_argument("--cmd", default=None, help="the command line to time (default: the kdactl script beside this Python, gate)")
    args = ap.parse_args()
    if args.n < 1:
        ap.error(f"-n must be at least 1, got {args.n}")
    if args.signed and not args.fake:
        ap.error("--signed needs --fake (on a node, set KDACTL_TRUSTED_KEYS instead)")
    kdactl = Path(sys.executable).with_name("kdactl")
    cmd = shlex.split(args.cmd) if args.cmd else ([str(kdactl)] if kdactl.exists() else [sys.executable, "-m", "kdactl"]) + ["gate"]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        if args.fake:
            env.update(fake_certificate(Path(tmp), args.signed))
        times, codes, first = time_runs(cmd, env, args.n)
    ms = [t * 1e3 for t in times]
    print(f"{shlex.join(cmd)}: median {statistics.median(ms):.1f} ms, min {min(ms):.1f}, max {max(ms):.1f} over {args.n} runs; "
          f"exit {', '.join(map(str, sorted(codes)))}; {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
