"""The fleet store at scale: certificates as kdactl's own certify pipeline writes them (8-GPU H200 nodes,
~1,040 results each, built by certify_command over tests.certify_fakes and sealed by certificate.seal),
ingested with `kdactl fleet ingest`, then `kdactl fleet report` timed with /usr/bin/time -v.

  python3 tools/fleet_scale.py --db /tmp/fleet.db                       # 2,000 nodes x 5 runs = 10,000
  python3 tools/fleet_scale.py --db postgresql://postgres@127.0.0.1/fleet [--copy-from /tmp/fleet.db]
  python3 tools/fleet_scale.py --db /tmp/fleet.db --replicate 10 --skip-ingest  # 100,000 (below)

One certificate is built by the pipeline; each of the others is that document with its node, GPU
uuids, times and perf measurements changed (3 % of runs fail a route smoke, 1 % are inconclusive,
5 % of nodes drift) and sealed again, written in batches, ingested, and removed again (10,000 files
are 2.3 GB). --replicate K then copies every stored row K-1 more times in SQL under new node names
(node-00000-r1, ...), which multiplies the store without generating and verifying
another 90,000 documents: the rows are those ingest extracted, the report reads only them.
Prints one line per measurement: report format, wall seconds, peak RSS MiB.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kdactl.certify import certificate as cm  # noqa: E402
from kdactl.certify.command import CertifyOptions, certify_command  # noqa: E402
from kdactl.results import CheckResult  # noqa: E402
from tests import certify_fakes as cf  # noqa: E402

SHAPES = ("B1-T4096-H8", "B2-T1024-H16", "varlen(17,300,1000)-H4", "B1-T8192-H64", "B1-T8192-H96", "B2-T16384-H64",
          "B8-T4096-H12", "B4-T2048-H32")  # fmt: skip
SUITE_CHECKS = 110  # per GPU, with 4 sanitizers, 8 perf shapes and the node checks: ~1,040 results on 8 GPUs
START = (datetime.now(timezone.utc) - timedelta(days=7 * 5 - 2)).replace(hour=0, minute=0, second=0, microsecond=0)


def template(tmp: Path) -> dict:
    """One certificate from the certify pipeline over a fake 8 x H200 node."""
    runner = cf.fault_runner()
    runner.behaviours[("suite", None)] = lambda job: [
        CheckResult(f"test_kda[{i:03d}-B1-T{64 * (i % 64 + 1)}-H{4 + i % 8}]", "pass", "ok", 0.12, job.index) for i in range(SUITE_CHECKS)]
    runner.behaviours[("sanitize", None)] = lambda job: [
        CheckResult(f"sanitize.{t}", "pass", "ERROR SUMMARY: 0 errors", 30.0, job.index) for t in ("memcheck", "synccheck", "racecheck", "initcheck")]
    runner.behaviours[("perf", None)] = lambda job: [
        CheckResult(f"perf[{s}]", "pass", "within tolerance", 2.0, job.index,
                    perf={"shape": s, "measured": 0.1, "baseline": 0.1, "threshold": 0.11, "unit": "ms", "timer": "kineto"}) for s in SHAPES]
    deps = replace(cf.deps(cf.node(8), runner, now=lambda: START), hostname=lambda: "node-00000")
    out = tmp / "template.json"
    return certify_command(cf.settings(tmp), CertifyOptions(out=out), deps).cert


def variant(doc: dict, node: int, run: int, rng: random.Random) -> dict:
    """``doc`` as node ``node``'s run ``run`` (runs a week apart, the last 2 days ago), in place, sealed again."""
    host = f"node-{node:05d}"
    issued = START + timedelta(days=7 * run, seconds=node)
    doc["node"]["hostname"] = host
    uuids = [f"GPU-{node:08x}-{g:04x}-2222-3333-444444444444" for g in range(8)]
    doc["node"]["fingerprint"]["gpu_uuids"] = uuids
    for g, u in zip(doc["gpus"], uuids):
        g["uuid"] = u
    doc["issued_at"], doc["expires_at"] = cm.stamp(issued), cm.stamp(issued + timedelta(days=7))
    drifting = node % 20 == 0 and run == 4
    for r in doc["results"]:
        if r["check"].startswith("perf["):
            r["measured"] = round(0.1 * (1.3 if drifting else 1.0) * rng.uniform(0.97, 1.03), 6)
        elif r["check"] == "test_kda[000-B1-T64-H4]":
            r["status"], r["message"] = "pass", "ok"
    roll = rng.random()
    if roll < 0.03:
        bad = next(r for r in doc["results"] if r["check"] == "test_kda[000-B1-T64-H4]" and r["gpu"] == 3)
        bad["status"], bad["message"] = "fail", "error ratio 0.3 > 5e-3"
        doc["verdict"], doc["reason"] = "not_certified", "gpu3:test_kda[000-B1-T64-H4]: error ratio 0.3 > 5e-3"
    elif roll < 0.04:
        doc["verdict"], doc["reason"] = "inconclusive", "gpu5:sanitize.racecheck: compute-sanitizer timed out"
    else:
        doc["verdict"], doc["reason"] = "certified", f"{len(doc['results'])} checks, none failed"
    return cm.seal(doc, None)


def generate_and_ingest(db: str, nodes: int, runs: int, work: Path, batch: int) -> float:
    """Write ``batch`` certificates at a time, ingest them with the CLI, remove them. Ingest seconds."""
    rng = random.Random(1)
    doc = template(work)
    print(f"template: {len(doc['results'])} results, {len(cm.certificate_text(doc)) / 1024:.0f} KiB", flush=True)
    jobs = [(n, r) for r in range(runs) for n in range(nodes)]
    spent = 0.0
    for start in range(0, len(jobs), batch):
        folder = work / "batch"
        folder.mkdir(exist_ok=True)
        for n, r in jobs[start : start + batch]:
            (folder / f"node-{n:05d}-{r}.json").write_text(cm.certificate_text(variant(doc, n, r, rng)))
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kdactl", "fleet", "ingest", str(folder), "--db", db, "--json"],
                              capture_output=True, text=True)  # fmt: skip
        spent += time.monotonic() - t0
        if proc.returncode != 0:
            sys.exit(f"ingest failed ({proc.returncode}): {proc.stderr[-2000:]}{proc.stdout[-2000:]}")
        shutil.rmtree(folder)
        print(f"  ingested {min(start + batch, len(jobs))}/{len(jobs)} ({spent:.0f} s)", flush=True)
    return spent


def replicate(db: str, copies: int) -> None:
    """Copy every stored row ``copies - 1`` more times under new node names (and digests)."""
    from kdactl.fleet.store import CERT_COLUMNS, Store

    with Store(db) as st:
        top = int(st.db.rows("SELECT MAX(id) FROM certs")[0][0])
        rest = [c for c in CERT_COLUMNS if c not in ("digest", "node", "issued_at", "expires_at")]
        for k in range(1, copies):
            shift, tag = k * (top + 1), f"-r{k}"
            with st.db.transaction():
                st.db.execute(f"""INSERT INTO certs (id, digest, node, issued_at, expires_at, {', '.join(rest)}, source, ingested_at)
                    SELECT id + ?, digest || ?, node || ?, issued_at, expires_at, {', '.join(rest)}, source, ingested_at
                    FROM certs WHERE id <= ?""", (shift, tag, tag, top))  # fmt: skip
                # a series key per new node: the low 4 bits of the hash replaced by the copy's number
                st.db.execute("INSERT INTO perf SELECT cert_id + ?, node || ?, issued_at, (series / 16) * 16 + ?, gpu, sku, shape, "
                              "unit, measured, baseline FROM perf WHERE cert_id <= ?", (shift, tag, k, top))  # fmt: skip
                st.db.execute("INSERT INTO problems SELECT cert_id + ?, kind, gpu, detail FROM problems WHERE cert_id <= ?", (shift, top))
                st.db.execute("INSERT INTO docs SELECT cert_id + ?, doc FROM docs WHERE cert_id <= ?", (shift, top))
            print(f"  replicated copy {k}: {st.count()} certificates", flush=True)
        if st.db.dialect == "postgresql":
            st.db.execute("SELECT setval(pg_get_serial_sequence('certs', 'id'), (SELECT MAX(id) FROM certs))")
            st.db.execute("ANALYZE")
        else:
            st.db.execute("ANALYZE")


def copy_store(source: str, db: str, chunk: int = 2000) -> None:
    """Every row of the store ``source`` into the empty store ``db`` (SQLite into PostgreSQL, say),
    ids kept: the same contents without generating and verifying the documents again."""
    from kdactl.fleet.store import Store

    with Store(source) as src, Store(db) as dst:
        for table in ("certs", "docs", "perf", "problems"):
            cols = [r[1] for r in src.db.rows(f"PRAGMA table_info({table})")]
            cur = src.db.execute(f"SELECT {', '.join(cols)} FROM {table}")
            while rows := cur.fetchmany(chunk):
                with dst.db.transaction():
                    dst.db.many(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", rows)
            print(f"  copied {table}", flush=True)
        if dst.db.dialect == "postgresql":
            dst.db.execute("SELECT setval(pg_get_serial_sequence('certs', 'id'), (SELECT MAX(id) FROM certs))")
        dst.db.execute("ANALYZE")


def timed_report(db: str, fmt: str, extra: list[str]) -> tuple[float, float, int]:
    """(wall s, peak RSS MiB, output bytes) of one `kdactl fleet report`, by /usr/bin/time -v."""
    with tempfile.NamedTemporaryFile("w+") as out:
        proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "kdactl", "fleet", "report", "--db", db,
                               "--format", fmt, *extra], stdout=out, stderr=subprocess.PIPE, text=True)  # fmt: skip
        if proc.returncode not in (0, 1):
            sys.exit(f"report failed ({proc.returncode}): {proc.stderr[-2000:]}")
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
        return seconds, int(rss.group(1)) / 1024, os.path.getsize(out.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="SQLite file or postgresql:// URL (an empty store)")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1000, help="certificates on disk at a time")
    ap.add_argument("--replicate", type=int, default=1, help="multiply the stored rows this many times in SQL")
    ap.add_argument("--skip-ingest", action="store_true", help="the store is already filled")
    ap.add_argument("--copy-from", help="fill the store with the rows of this SQLite store instead of ingesting")
    args = ap.parse_args()
    if args.copy_from:
        copy_store(args.copy_from, args.db)
    elif not args.skip_ingest:
        with tempfile.TemporaryDirectory(prefix="fleet-scale-") as work:
            spent = generate_and_ingest(args.db, args.nodes, args.runs, Path(work), args.batch)
            print(f"ingest: {args.nodes * args.runs} certificates in {spent:.0f} s ({1000 * spent / (args.nodes * args.runs):.1f} ms each)")
    if args.replicate > 1:
        replicate(args.db, args.replicate)
    if not args.db.startswith("postgres"):
        print(f"store: {os.path.getsize(args.db) / 2**20:.0f} MiB")
    for fmt, extra in (("table", []), ("json", []), ("html", []), ("markdown", []), ("table", ["--since", "2030-01-01"])):
        wall, rss, size = timed_report(args.db, fmt, extra)
        print(f"report --format {fmt} {' '.join(extra)}: {wall:.2f} s, peak RSS {rss:.0f} MiB, {size / 1024:.0f} KiB out", flush=True)


if __name__ == "__main__":
    main()
