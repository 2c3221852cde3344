"""kdactl gate's start-up: the console script answers a plain ``kdactl gate`` without typer, pydantic
or torch (what it imports is what it costs; tools/bench_gate.py measures the time), and answers it
as the typer command does."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.cli import app
from kdactl.entry import gate_args
from tests import certify_fakes as cf
from tests.tools import require_module

HEAVY = ("torch", "typer", "pydantic", "click", "cryptography", "rich")


@pytest.fixture
def fresh_env(tmp_path):
    """A certified 8-GPU certificate issued now; no GPU here, so gate cannot read the node (3)."""
    s = cf.settings(tmp_path)
    certify_command(s, CertifyOptions(), cf.deps(cf.node(8), now=cm.now_utc))
    return {"HOME": str(tmp_path), "KDACTL_DATA_DIR": str(s.data_dir), "KDACTL_CACHE_DIR": str(s.cache_dir),
            "KDACTL_CERT_KEY": "", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(cf.ROOT)}  # fmt: skip


def run_console_script(env, *args):
    """The console script's own entry (kdactl.entry:main) in a fresh process; prints, after gate's
    output, which heavy modules were imported."""
    code = ("import json, sys\nfrom kdactl.entry import main\n"
            f"try:\n    main({list(args)!r})\nexcept SystemExit as e:\n    code = e.code\n"
            f"sys.stdout.write('\\nMODULES ' + json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))) + f' EXIT {{code}}\\n')\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=cf.ROOT)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out, _, tail = proc.stdout.rpartition("\nMODULES ")
    modules, _, code = tail.strip().partition(" EXIT ")
    return out, json.loads(modules), int(code)


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_gate_imports_neither_torch_nor_typer_nor_rich(fresh_env, as_json):
    out, modules, code = run_console_script(fresh_env, "gate", *(["--json"] if as_json else []))
    assert modules == [], f"kdactl gate imported {modules}"
    assert code == 3  # no NVML here: cannot tell
    if as_json:
        assert json.loads(out)["result"] == "unknown"
    else:
        assert out.startswith("UNKNOWN: ")


def test_the_fast_gate_answers_as_the_typer_command(fresh_env):
    out, _, code = run_console_script(fresh_env, "gate", "--json", "--cert", str(Path(fresh_env["KDACTL_DATA_DIR"]) / "cert.json"))
    typer = CliRunner().invoke(app, ["gate", "--json", "--cert", str(Path(fresh_env["KDACTL_DATA_DIR"]) / "cert.json")], env=fresh_env)
    assert (code, json.loads(out)) == (typer.exit_code, json.loads(typer.stdout))
    lines, _, code = run_console_script({**fresh_env, "KDACTL_DATA_DIR": "/nonexistent"}, "gate")
    assert code == 1 and lines.startswith("FAIL: no certificate at /nonexistent/cert.json")


def test_help_and_typos_go_to_typer(fresh_env):
    out, modules, code = run_console_script(fresh_env, "gate", "--help")
    assert code == 0 and "--key-file" in out and "typer" in modules
    out, modules, code = run_console_script(fresh_env, "gate", "--cret", "x")
    assert code == 2 and "typer" in modules


@pytest.mark.parametrize("argv,want", [
    (["gate"], {"as_json": False}),
    (["gate", "--json", "--cert", "c.json"], {"as_json": True, "cert": Path("c.json")}),
    (["gate", "--key-file=k", "--cert=c"], {"as_json": False, "cert": Path("c"), "key_file": Path("k")}),
    (["gate", "--trusted-keys", "t", "--json"], {"as_json": True, "trusted_keys": Path("t")}),
    (["gate", "--trusted-keys"], None), (["gate", "--trusted-keys=t", "--trusted-keys=u"], None),
    (["gate", "--help"], None), (["gate", "--cert"], None), (["gate", "--cert", "--json"], None),
    (["gate", "--cert", ""], None), (["gate", "--json", "--json"], None), (["gate", "--cert", "a", "--cert", "b"], None),
    (["gate", "extra"], None), (["verify", "c.json"], None), ([], None),
])  # fmt: skip
def test_gate_args(argv, want):
    assert gate_args(argv) == want


@pytest.fixture
def signed_env(tmp_path, fresh_env):
    """fresh_env's node (node-a) certified again with its own Ed25519 key; ``trusted`` lists that key
    for node-a, ``swapped`` lists it for node-b only."""
    require_module("cryptography", "pip install 'kdactl[signing]' (the test extra has it)")
    from kdactl.certify.keygen import keygen_command

    s = cf.settings(tmp_path)
    line = keygen_command(s, tmp_path / "node.pem", "node-a").trusted_line
    certify_command(cf.settings(tmp_path, KDACTL_SIGNING_KEY=str(tmp_path / "node.pem")), CertifyOptions(), cf.deps(cf.node(8), now=cm.now_utc))
    (tmp_path / "trusted").write_text(line + "\n")
    (tmp_path / "swapped").write_text(line.replace("node-a", "node-b") + "\n")
    return fresh_env, tmp_path


def test_gate_checks_a_node_signature_and_loads_cryptography_only_then(signed_env):
    env, tmp = signed_env
    out, modules, code = run_console_script(env, "gate", "--json")
    assert "cryptography" not in modules and code == 3  # signature noted, not checked; no NVML here
    out, modules, code = run_console_script(env, "gate", "--json", "--trusted-keys", str(tmp / "trusted"))
    assert "cryptography" in modules and code == 3 and json.loads(out)["reasons"][0].startswith("cannot read the node now")
    args = ["gate", "--json", "--trusted-keys", str(tmp / "swapped")]
    out, modules, code = run_console_script(env, *args)
    typer = CliRunner().invoke(app, args, env=env)
    assert (code, json.loads(out)) == (typer.exit_code, json.loads(typer.stdout))
    assert code == 1 and "not by a key of node-a" in json.loads(out)["reasons"][0] and modules == []


def test_reading_an_aot_bundle_imports_no_builder():
    """kdactl gate looks up the node's library (an AOT bundle or the cache) on every run: that must
    not import the builder (filelock pulls in asyncio: about 0.1 s of a gate on an H200 node)."""
    code = "import sys, kdactl.jit.aot, kdactl.jit.cache; print(sorted(m for m in ('filelock', 'asyncio', 'kdactl.jit.build') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=cf.ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
