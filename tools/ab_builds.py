"""Time kernel builds of several git revisions side by side, in one process tree on one GPU.

Each arm is NAME=REV: a tree of REV's csrc/, kdactl/, fleet/, checks/ and pyproject.toml (``git
archive``), a folder that holds such a tree, or ``.`` for the checkout as installed. All arms build at
once, each into its own kernel cache; then ``kdactl bench`` runs the same shapes and arguments once per
arm in the order A B ... B A, so that a drift of clocks or temperature over the visit falls on every
arm alike. One table gives every run's median per shape and each arm's mean against the first arm's. A
failed build is reported and its arm still benched (bench builds what is missing, and says why it
cannot); a bench that fails (a kernel fault) is reported with its error, and the others go on.

    python3 tools/ab_builds.py --arm main=main --arm try=BRANCH --shape 1,8192,12 --shape 1,65536,8 \\
        -- --config lower-bound --gate-params flashkda --routes auto --peers none --iters 3 --warmup 1

Run it from the repository root. Where the GPU node's git lacks the revisions, make the trees where it
has them (``--trees-only --work .ab``, a folder to carry) and name those folders there (``--arm
try=.ab/trees/try``). What follows ``--`` goes to every ``kdactl bench`` as it is. --out keeps each run's
JSON and the table (table.md)."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kdactl.atomic import write_text_atomic
from kdactl.bench.report import md_table

TREE_PATHS = ("csrc", "kdactl", "fleet", "checks", "pyproject.toml")  # what kdactl runs from (fleet: the SKU matrix)
CHECKOUT = "."


@dataclass(frozen=True)
class Arm:
    name: str
    rev: str  # a git revision, a folder holding a tree, or CHECKOUT

    @property
    def from_git(self) -> bool:
        """Whether this arm's tree is made from a git revision (not a folder, not the checkout)."""
        return self.rev != CHECKOUT and not Path(self.rev, "kdactl").is_dir()

    def tree(self, work: Path) -> Path | None:
        """Where this arm's kdactl runs from (None: the checkout as installed)."""
        if self.rev == CHECKOUT:
            return None
        return work / "trees" / self.name if self.from_git else Path(self.rev)


def parse_arm(text: str) -> Arm:
    name, sep, rev = text.partition("=")
    if not sep or not name or not rev:
        raise argparse.ArgumentTypeError(
            f"--arm takes NAME=REV (REV a git revision, a tree's folder or '.'), got {text!r}"
        )
    return Arm(name, rev)


def mirrored_order(names: list[str]) -> list[str]:
    """A B ... B A: each arm twice, the first run's order reversed for the second."""
    return [*names, *reversed(names)]


def run_medians(report: dict, candidate: str = "auto") -> dict[str, tuple[float | None, str | None]]:
    """shape key -> (the candidate's median ms, or None, and why not) from one ``kdactl bench --json``."""
    out: dict[str, tuple[float | None, str | None]] = {}
    for entry in report.get("shapes", []):
        key = entry["shape"]["key"]
        found = next((c for c in entry.get("candidates", []) if c["name"] == candidate), None)
        if entry.get("error"):
            out[key] = (None, entry["error"])
        elif found is None or found.get("status") != "ok" or not found.get("timing"):
            out[key] = (None, (found or {}).get("reason") or f"no {candidate} timing")
        else:
            out[key] = (found["timing"]["median_ms"], None)
    return out


def table(names: list[str], runs: list[tuple[str, dict | None, str | None]]) -> str:
    """Markdown: a row per shape, a column per arm with its runs' medians (ms) and its mean against the
    first arm's. ``runs``: (arm, bench JSON or None, the error that stopped the run) in run order."""
    shapes: list[str] = []
    per: dict[tuple[str, str], list[float]] = {}
    errors: list[str] = []
    for name, report, error in runs:
        if report is None:
            errors.append(f"- {name}: {error}")
            continue
        for key, (ms, why) in run_medians(report).items():
            if key not in shapes:
                shapes.append(key)
            if ms is None:
                errors.append(f"- {name}, {key}: {why}")
            else:
                per.setdefault((name, key), []).append(ms)
    body = []
    for key in shapes:
        base = per.get((names[0], key))
        cells = []
        for name in names:
            got = per.get((name, key))
            if not got:
                cells.append("-")
                continue
            cell = ", ".join(f"{ms:.3f}" for ms in got)
            if base and name != names[0]:
                cell += f" ({statistics.fmean(got) / statistics.fmean(base):.3f}x)"
            cells.append(cell)
        body.append([key, *cells])
    return "\n".join(md_table(["shape", *names], body) + ([""] + errors if errors else [])) + "\n"


def make_tree(rev: str, dest: Path) -> None:
    """REV's TREE_PATHS under dest (emptied first), from git."""
    tar = subprocess.run(["git", "archive", "--format=tar", rev, *TREE_PATHS], check=True, capture_output=True).stdout
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(dest, filter="data")


def arm_env(arm: Arm, work: Path) -> dict[str, str]:
    """The environment that runs this arm's kdactl with its own kernel cache."""
    env = dict(os.environ, KDACTL_CACHE_DIR=str(work / "cache" / arm.name))
    tree = arm.tree(work)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree.resolve()), env.get("PYTHONPATH")]))
    return env


def run_python(arm: Arm, work: Path, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    # -P: run from the repository root, `python -m` would put the checkout's kdactl before PYTHONPATH's
    return subprocess.run([sys.executable, "-P", *args], env=arm_env(arm, work), capture_output=True, text=True,
                          timeout=timeout_s, check=False)  # fmt: skip


def kdactl(arm: Arm, work: Path, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    return run_python(arm, work, ["-m", "kdactl", *args], timeout_s)


def csrc_of(arm: Arm, work: Path) -> str:
    """The kernel sources this arm's kdactl builds."""
    done = run_python(arm, work, ["-c", "import kdactl.assets as a; print(a.csrc_dir())"], 60)
    return done.stdout.strip() or last_line(done.stderr)


def last_line(text: str) -> str:
    return next((line for line in reversed(text.strip().splitlines()) if line.strip()), "")


def bench_once(arm: Arm, work: Path, bench_args: list[str], timeout_s: float) -> tuple[dict | None, str | None]:
    try:
        done = kdactl(arm, work, ["bench", *bench_args, "--json"], timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"bench passed its {timeout_s:.0f} s limit"
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return None, f"bench exit {done.returncode}: {last_line(done.stderr) or 'no JSON'}"
    if not report.get("shapes"):
        return None, f"bench exit {done.returncode}: {report.get('error') or last_line(done.stderr)}"
    return report, None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, bench_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", dest="arms", type=parse_arm, action="append", required=True, metavar="NAME=REV")
    ap.add_argument("--shape", dest="shapes", action="append", default=[], metavar="B,T,H",
                    help="passed to every bench as --shape (or give --suite after --)")  # fmt: skip
    ap.add_argument("--build-timeout", type=float, default=300.0)
    ap.add_argument("--bench-timeout", type=float, default=120.0)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "kdactl_ab")
    ap.add_argument("--out", type=Path, help="a folder for each run's JSON and table.md")
    ap.add_argument("--trees-only", action="store_true", help="make the arms' trees under --work, then stop")
    args = ap.parse_args(ours)
    names = [a.name for a in args.arms]
    if len(set(names)) != len(names):
        ap.error(f"arm names repeat: {names}")
    bench_args = [*(x for s in args.shapes for x in ("--shape", s)), *bench_args]

    for arm in args.arms:
        if arm.from_git:
            try:
                make_tree(arm.rev, arm.tree(args.work))
            except subprocess.CalledProcessError as err:
                ap.error(f"--arm {arm.name}={arm.rev}: neither a folder with kdactl/ nor a revision git can archive "
                         f"({last_line(err.stderr.decode(errors='replace'))})")  # fmt: skip
    if args.trees_only:
        print(f"trees in {args.work / 'trees'}: " + ", ".join(names))
        return 0

    def build(arm: Arm) -> str | None:
        try:
            done = kdactl(arm, args.work, ["build"], args.build_timeout)
        except subprocess.TimeoutExpired:
            return f"build passed its {args.build_timeout:.0f} s limit"
        return None if done.returncode == 0 else f"build exit {done.returncode}: {last_line(done.stderr + done.stdout)}"

    with ThreadPoolExecutor(len(args.arms)) as pool:
        build_errors = dict(zip(names, pool.map(build, args.arms), strict=True))
    for arm in args.arms:
        print(f"build {arm.name} ({csrc_of(arm, args.work)}): {build_errors[arm.name] or 'ok'}", flush=True)

    by_name = {a.name: a for a in args.arms}
    runs: list[tuple[str, dict | None, str | None]] = []
    for i, name in enumerate(mirrored_order(names)):
        report, error = bench_once(by_name[name], args.work, bench_args, args.bench_timeout)
        print(f"run {i + 1}: {name}: {error or 'ok'}", flush=True)
        runs.append((name, report, error))
        if args.out and report is not None:
            write_text_atomic(args.out / f"run{i + 1}_{name}.json", json.dumps(report))
    text = table(names, runs)
    print(text, end="")
    if args.out:
        write_text_atomic(args.out / "table.md", text)
    return 0 if all(report is not None for _, report, _ in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
