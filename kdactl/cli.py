"""The kdactl command line. Each command declares options, calls one domain function, and
leaves rendering and the exit code to ``_run``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from kdactl.emit import Report, emit_error, run_report
from kdactl.settings import Settings

try:  # typer >= 0.22 carries its own copy of click
    from typer import _click as click
except ImportError:  # older typer runs on click itself
    import click  # type: ignore[no-redef]


def _command_name(ctx: Any) -> str | None:
    """'fleet ingest' for the context of ``kdactl fleet ingest`` (the program name left out)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(reversed(names)) or None


class _JsonErrorsGroup(TyperGroup):
    """Click's own usage errors (an unknown option, a value of the wrong type: exit 2) end under
    --json as kdactl's own errors do: one line on stderr and one JSON document on stdout."""

    def main(  # type: ignore[override]  # click's main, with its arguments named (they are passed by name)
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        named: dict[str, Any] = dict(prog_name=prog_name, complete_var=complete_var, **extra)
        if "--json" not in argv:
            return super().main(argv, standalone_mode=standalone_mode, **named)
        try:
            code = super().main(argv, standalone_mode=False, **named)
        except click.exceptions.ClickException as err:
            code = err.exit_code
            emit_error(err.format_message(), code, True, _command_name(getattr(err, "ctx", None)))
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="kdactl",
    cls=_JsonErrorsGroup,
    help="Certify GPU nodes for KDA prefill: detect, build, validate, sanitize, benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON document on stdout.")
TrustedKeysOpt = typer.Option(
    None,
    "--trusted-keys",
    help="Trusted node public keys, lines 'HOSTNAME BASE64-KEY' (default: KDACTL_TRUSTED_KEYS); a node signature by a key of the certificate's own host is then required.",
)


def _run(as_json: bool, action: Callable[[Settings], Report]) -> None:
    """Run a command body and render its result; the SPEC exit code (kdactl.emit.run_report)."""
    command = _command_name(click.globals.get_current_context(silent=True))
    raise typer.Exit(run_report(action, as_json, command))


@app.command()
def detect(as_json: bool = JsonOpt) -> None:
    """Report the node's GPUs, driver, CUDA versions and the kernel target chosen."""
    from kdactl.node import detect_node

    _run(as_json, detect_node)


@app.command()
def build(
    target: str | None = typer.Option(
        None, "--target", help="Comma-separated targets (sm_90a,sm_100f,...): compile only, no GPU needed."
    ),
    aot: Path | None = typer.Option(None, "--aot", help="Write a relocatable AOT bundle with a manifest here."),
    as_json: bool = JsonOpt,
) -> None:
    """Build (JIT, cached) or load (AOT) the kernel library for this node, and run its self-test."""
    from kdactl.build_command import build_command

    _run(as_json, lambda s: build_command(s, targets=target, aot_dir=aot, as_json=as_json))


@app.command()
def bench(
    suite: str | None = typer.Option(
        None,
        "--suite",
        help="smoke | small-bh | serving | production | kimi-linear | all (default smoke when no --shape/--varlen).",
    ),
    shape: list[str] | None = typer.Option(None, "--shape", help="B,T,H[,K,V] (repeatable; K = V = 128 by default)."),
    varlen: list[str] | None = typer.Option(
        None, "--varlen", help="L1,L2,... sequence lengths of one varlen batch (repeatable; needs --heads)."
    ),
    heads: int | None = typer.Option(None, "--heads", help="Heads for --varlen."),
    routes: str | None = typer.Option(
        None, "--routes", help="Comma list of auto,direct,chunk,small_bh (default: auto and every route built)."
    ),
    peers: str = typer.Option(
        "fla",
        "--peers",
        help="Comma list of fla (chunk_kda with FLA_FLASH_KDA=0, fused_recurrent_kda), fla-chunk (chunk_kda alone), flashkda (flash_kda.fwd), cudnn (kda_hopper_cuda); all; or none.",
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        help="plain | lower-bound | softplus: how g, q/k and beta are given, for every shape (default: the suite's own; plain for --shape/--varlen).",
    ),
    gate_params: str | None = typer.Option(
        None,
        "--gate-params",
        help="test | init | flashkda: how a gate from raw logits gets A_log and dt_bias (test: fla's tests, log U(1,16) and N(0,1); init: fla's KDA layer at initialization, weak decay; flashkda: FlashKDA's tests, U(0,1) and U(0,1), strong decay). Default test.",
    ),
    iters: int = typer.Option(24, "--iters", help="Timed iterations per candidate and shape."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed calls per candidate first (fla autotunes on the first)."),
    markdown: str | None = typer.Option(
        None, "--markdown", help="Write a markdown table to FILE ('-': stdout, instead of the table)."
    ),
    plot: Path | None = typer.Option(None, "--plot", help="Write a bar chart to FILE.png (needs matplotlib)."),
    gate: bool = typer.Option(False, "--gate", help="Exit 1 when a shape is clearly slower than its SKU baseline."),
    record_baseline: bool = typer.Option(
        False, "--record-baseline", help="Write this run's medians into the SKU baseline."
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="Baseline file (default fleet/baselines/<SKU>.toml)."
    ),
    tolerance: float | None = typer.Option(
        None, "--tolerance", help="Tolerance stored by --record-baseline (default 0.10)."
    ),
    device: int = typer.Option(0, "--device", help="CUDA device index."),
    timer: str = typer.Option(
        "auto",
        "--timer",
        help="auto (kineto: device time through torch's profiler, summed over the call's kernels), kineto, kineto-span "
        "(from the call's first kernel's start to its last one's end: the gaps between kernels count), cupti (needs "
        "cupti-python) or cuda-events.",
    ),
    host: bool = typer.Option(
        False,
        "--host",
        help="CPU microseconds per call (eager and CUDA-graph replay) instead of device time; default shapes B1 T64 H4 and a 4-sequence varlen batch.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Time KDA prefill routes against each other and against peers: cold L2, ABBA order, checked first."""
    from kdactl.bench import BenchOptions, run_bench

    opts = BenchOptions(suite=suite, shapes=tuple(shape or ()), varlens=tuple(varlen or ()), heads=heads,
                        routes=routes, peers=peers, config=config, gate_params=gate_params, iters=iters, warmup=warmup, gate=gate,
                        record_baseline=record_baseline, baseline=baseline, tolerance=tolerance,
                        markdown=markdown, plot=plot, device=device, timer=timer, host=host, as_json=as_json)  # fmt: skip
    _run(as_json, lambda s: run_bench(s, opts))


@app.command()
def certify(
    gpus: str = typer.Option("all", "--gpus", help="all, or a comma list of GPU indices (0,2)."),
    expect_gpus: int | None = typer.Option(None, "--expect-gpus", help="Fail the node unless it has exactly N GPUs."),
    expect_sku: str | None = typer.Option(
        None, "--expect-sku", help="Fail the node unless every GPU is this SKU (H200, B200, ...)."
    ),
    quick: bool = typer.Option(
        False, "--quick", help="Contracts, route smokes and memcheck only (no perf gate); writes cert-quick.json."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Certificate file (default <data dir>/cert.json, the one gate reads)."
    ),
    junit: Path | None = typer.Option(
        None, "--junit", help="Also write JUnit XML here (one testcase per check per GPU)."
    ),
    prom: Path | None = typer.Option(
        None, "--prom", help="Also write a node_exporter textfile-collector file here (.prom)."
    ),
    lifetime: float = typer.Option(7.0, "--lifetime", help="Days until the certificate expires."),
    fail_on: str | None = typer.Option(None, "--fail-on", help="'warn': a warning fails the node."),
    key_file: Path | None = typer.Option(
        None, "--key-file", help="HMAC key file to sign with (default: KDACTL_CERT_KEY)."
    ),
    signing_key: Path | None = typer.Option(
        None,
        "--signing-key",
        help="This node's Ed25519 private key (PEM) to sign with (default: KDACTL_SIGNING_KEY; needs the signing extra).",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Certify this node: detect, build/load, validation suite, sanitizers, perf gate; write the certificate."""
    from kdactl.certify.command import CertifyOptions, certify_command

    opts = CertifyOptions(gpus=gpus, expect_gpus=expect_gpus, expect_sku=expect_sku, quick=quick, out=out, junit=junit,
                          prom=prom, lifetime_days=lifetime, fail_on=fail_on, key_file=key_file,
                          signing_key=signing_key, as_json=as_json)  # fmt: skip
    _run(as_json, lambda s: certify_command(s, opts))


@app.command()
def verify(
    cert: Path = typer.Argument(..., help="The certificate (JSON) to check."),
    key_file: Path | None = typer.Option(
        None, "--key-file", help="HMAC key file (default: KDACTL_CERT_KEY); a signature is then required."
    ),
    trusted_keys: Path | None = TrustedKeysOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Check a certificate's digest, signatures and expiry: 0 valid, 1 changed/expired/badly signed, 2 unreadable."""
    from kdactl.certify.verify import verify_command

    _run(as_json, lambda s: verify_command(s, cert, key_file, trusted_keys))


@app.command()
def gate(
    cert: Path | None = typer.Option(None, "--cert", help="Certificate (default <data dir>/cert.json)."),
    key_file: Path | None = typer.Option(None, "--key-file", help="HMAC key file (default: KDACTL_CERT_KEY)."),
    trusted_keys: Path | None = TrustedKeysOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Fast pass/fail for Slurm and Kubernetes: the cached certificate and the node's fingerprint now."""
    from kdactl.certify.gate import gate_command

    _run(as_json, lambda s: gate_command(s, cert, key_file, trusted_keys))


@app.command()
def keygen(
    out: Path = typer.Option(
        ...,
        "--out",
        help="Where to write this node's new Ed25519 private key (PEM, mode 0600; never over an existing file).",
    ),
    hostname: str | None = typer.Option(
        None, "--hostname", help="The host the key is for (default: this host's name, as certify records it)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Make this node's signing key; print its line for the verifiers' trusted-keys file (needs the signing extra: cryptography)."""
    from kdactl.certify.keygen import keygen_command

    _run(as_json, lambda s: keygen_command(s, out, hostname))


@app.command()
def sanitize(
    tool: str | None = typer.Option(
        None, "--tool", help="Comma list of memcheck,synccheck,racecheck,initcheck (default: all four)."
    ),
    gpu: int = typer.Option(0, "--gpu", help="GPU index to run on (CUDA_VISIBLE_DEVICES of the runs)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Time limit of each compute-sanitizer run, in seconds."),
    as_json: bool = JsonOpt,
) -> None:
    """Run the KDA kernels under compute-sanitizer, each tool first proven on a planted fault."""
    from kdactl.sanitizer.run import sanitize_command

    _run(as_json, lambda s: sanitize_command(s, tools=tool, gpu=gpu, timeout_s=timeout))


# ---------------------------------------------------------------------------------------------
# fleet, slurm, k8s

fleet_app = typer.Typer(
    help="Certificates from many nodes: ingest into a store (SQLite or PostgreSQL), report per SKU, prune.",
    no_args_is_help=True,
)
slurm_app = typer.Typer(help="Drain this node in Slurm, and resume it only if kdactl drained it.", no_args_is_help=True)
k8s_app = typer.Typer(
    help="Kubernetes: Node Feature Discovery labels from the cached certificate.", no_args_is_help=True
)
app.add_typer(fleet_app, name="fleet")
app.add_typer(slurm_app, name="slurm")
app.add_typer(k8s_app, name="k8s")
DbOpt = typer.Option(None, "--db", help="Fleet store: a SQLite file, or a postgresql:// URL (needs kdactl[postgres]); "
                     "default KDACTL_FLEET_DB, else <data dir>/fleet.db.")  # fmt: skip
NodeOpt = typer.Option(None, "--node", help="Slurm node name (default SLURMD_NODENAME, else the short hostname).")


@fleet_app.command("ingest")
def fleet_ingest(
    paths: list[Path] = typer.Argument(..., help="Certificate files, or directories of *.json certificates."),
    db: str | None = DbOpt,
    key_file: Path | None = typer.Option(
        None, "--key-file", help="HMAC key file (default: KDACTL_CERT_KEY); a signature is then required."
    ),
    trusted_keys: Path | None = TrustedKeysOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Verify each certificate and store it (once per digest, one transaction each); exit 1 if any was rejected."""
    from kdactl.fleet.ingest import ingest_command

    _run(as_json, lambda s: ingest_command(s, paths, db, key_file, trusted_keys=trusted_keys))


@fleet_app.command("report")
def fleet_report(
    fmt: str = typer.Option("table", "--format", help="table | markdown | json | html"),
    since: str | None = typer.Option(None, "--since", help="Only certificates issued at or after this ISO date/time."),
    tolerance: float = typer.Option(
        0.10, "--tolerance", help="Drift: latest perf worse than the GPU's own median by more than this."
    ),
    limit: int = typer.Option(100, "--limit", help="Problem nodes (and problem kinds) shown, most severe first."),
    offset: int = typer.Option(0, "--offset", help="Problem nodes skipped first (the next page)."),
    db: str | None = DbOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Per SKU: nodes certified / not / inconclusive / expired; problems by kind; perf per shape; problem nodes."""
    from kdactl.fleet.report import report_command

    _run(as_json, lambda s: report_command(s, db, fmt, since, tolerance, limit=limit, offset=offset))


@fleet_app.command("prune")
def fleet_prune(
    keep: int | None = typer.Option(None, "--keep", help="Keep each node's newest N certificates."),
    older_than: float | None = typer.Option(
        None, "--older-than", help="Remove certificates issued more than DAYS ago."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be removed; remove nothing."),
    db: str | None = DbOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Retention: remove older certificates; a node's latest is always kept."""
    from kdactl.fleet.prune import prune_command

    _run(as_json, lambda s: prune_command(s, db, keep, older_than, dry_run))


@slurm_app.command("drain")
def slurm_drain(
    reason: str | None = typer.Option(None, "--reason", help="Why; stored as 'kdactl: <reason>'."),
    node: str | None = NodeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Drain this node with a reason that starts 'kdactl:' (an operator's drain is left as it is)."""
    from kdactl.integrations.slurm import drain_command

    _run(as_json, lambda s: drain_command(s, reason, node))


@slurm_app.command("resume")
def slurm_resume(node: str | None = NodeOpt, as_json: bool = JsonOpt) -> None:
    """Resume this node only if its drain reason starts 'kdactl:' (never an operator's drain)."""
    from kdactl.integrations.slurm import resume_command

    _run(as_json, lambda s: resume_command(s, node))


@k8s_app.command("labels")
def k8s_labels(
    features_dir: Path = typer.Option(
        ..., "--features-dir", help="NFD features.d directory to write the 'kdactl' feature file into."
    ),
    cert: Path | None = typer.Option(None, "--cert", help="Certificate (default <data dir>/cert.json)."),
    key_file: Path | None = typer.Option(None, "--key-file", help="HMAC key file (default: KDACTL_CERT_KEY)."),
    trusted_keys: Path | None = TrustedKeysOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Write kdactl.io/certified, kernel-target and cert-expiry labels for Node Feature Discovery."""
    from kdactl.integrations.k8s import labels_command

    _run(as_json, lambda s: labels_command(s, features_dir, cert, key_file, trusted_keys=trusted_keys))


def main(argv: Sequence[str] | None = None) -> None:
    app(args=None if argv is None else list(argv))
