"""Per-node Ed25519 signatures: a certificate is valid only under a key trusted for its own host;
the trusted-keys file, the signing key and keygen; ``cryptography`` missing is a configuration
error; the SPEC's by-hand verification, run as written."""

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.certify import signing
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.keygen import keygen_command
from kdactl.cli import app
from kdactl.errors import UsageError
from tests import certify_fakes as cf
from tests.test_gate import gate as run_gate
from tests.test_verify import doc, verify
from tests.tools import require_module, require_tool



@pytest.fixture(autouse=True)
def _cryptography():
    require_module("cryptography", "pip install 'kdactl[signing]' (the test extra has it)")


@pytest.fixture
def keys(tmp_path):
    """node-a's and node-b's private keys, a stranger's, and the trusted-keys file listing a and b."""
    out = {}
    for host in ("node-a", "node-b", "stranger"):
        rep = keygen_command(cf.settings(tmp_path), tmp_path / f"{host}.pem", host)
        out[host] = (tmp_path / f"{host}.pem", rep.trusted_line)
    trusted = tmp_path / "trusted"
    trusted.write_text(f"# kdactl node keys\n{out['node-a'][1]}\n\n{out['node-b'][1]}  # rack 2\n")
    return out, trusted


def signer(keys, host):
    return signing.read_signer({}, keys[0][host][0])


def sealed(tmp_path, keys, host="node-a", signed_by="node-a", name="cert.json", **kw):
    path = tmp_path / name
    cm.write_certificate(path, cm.seal(doc(node={**doc()["node"], "hostname": host}, **kw), None,
                                       signer(keys, signed_by) if signed_by else None))  # fmt: skip
    return path


def verify_trusted(path, trusted):
    return verify(path, env={signing.TRUSTED_ENV: str(trusted)})


def test_own_node_key_is_valid(tmp_path, keys):
    rep = verify_trusted(sealed(tmp_path, keys), keys[1])
    assert rep.exit_code == 0 and rep.failures == []
    assert rep.to_json()["node_signature"] == signer(keys, "node-a").key_id


def test_another_nodes_key_is_invalid(tmp_path, keys):
    """node-b signs a certificate that says node-a: the digest is right, the key trusted, but not for node-a."""
    rep = verify_trusted(sealed(tmp_path, keys, host="node-a", signed_by="node-b"), keys[1])
    assert rep.exit_code == 1
    assert rep.failures == [f"signed by node-b's key {signer(keys, 'node-b').key_id}, not by a key of node-a: "
                            "a node's key signs only its own certificate"]  # fmt: skip


def test_untrusted_key_is_invalid(tmp_path, keys):
    rep = verify_trusted(sealed(tmp_path, keys, signed_by="stranger"), keys[1])
    assert rep.exit_code == 1
    assert re.fullmatch(r"signed with key [0-9a-f]{16}, which KDACTL_TRUSTED_KEYS .*trusted does not trust for node-a "
                        r"\(its keys: [0-9a-f]{16}\)", rep.failures[0])  # fmt: skip


def test_unlisted_host_is_invalid(tmp_path, keys):
    rep = verify_trusted(sealed(tmp_path, keys, host="node-z", signed_by="node-a"), keys[1])
    assert rep.exit_code == 1 and "not by a key of node-z" in rep.failures[0]


def test_tampered_document_is_invalid(tmp_path, keys):
    """The forger changes the verdict and fixes the digest, but cannot sign as node-a."""
    path = sealed(tmp_path, keys, verdict="not_certified")
    d = json.loads(path.read_text())
    d["verdict"] = "certified"
    d["integrity"]["sha256"] = cm.digest(d)
    path.write_text(json.dumps(d))
    rep = verify_trusted(path, keys[1])
    assert rep.exit_code == 1
    assert rep.failures == [f"node signature mismatch (key {signer(keys, 'node-a').key_id} of node-a): "
                            "the certificate was changed after it was signed"]  # fmt: skip


def test_a_signature_is_required_once_keys_are_trusted(tmp_path, keys):
    rep = verify_trusted(sealed(tmp_path, keys, signed_by=None), keys[1])
    assert rep.exit_code == 1 and "has no node signature" in rep.failures[0]


def test_without_trusted_keys_a_signature_is_noted_not_checked(tmp_path, keys):
    rep = verify(sealed(tmp_path, keys, signed_by="node-b"))
    assert rep.exit_code == 0 and any("not checked: no trusted keys" in n for n in rep.notes)


def test_node_signature_with_the_legacy_canonical_form_is_invalid(tmp_path, keys):
    path = sealed(tmp_path, keys)
    d = json.loads(path.read_text())
    d["integrity"]["canonical"] = cm.LEGACY_CANONICAL
    d["integrity"]["sha256"] = cm.digest(d, cm.LEGACY_CANONICAL)
    path.write_text(json.dumps(d))
    assert verify_trusted(path, keys[1]).failures == ["a node signature needs canonical 'rfc8785', the certificate says "
                                                      f"{cm.LEGACY_CANONICAL!r}"]  # fmt: skip


@pytest.fixture
def hide_cryptography(monkeypatch):
    """Call it to be as if the signing extra were not installed: every cryptography import fails."""

    def hide():
        for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
            monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.setitem(sys.modules, "cryptography", None)

    return hide


def test_no_cryptography_is_a_configuration_error(tmp_path, keys, hide_cryptography):
    path = sealed(tmp_path, keys)
    hide_cryptography()
    with pytest.raises(signing.SigningUnavailable, match=r"pip install 'kdactl\[signing\]'"):
        verify_trusted(path, keys[1])
    res = CliRunner().invoke(app, ["verify", "--json", "--trusted-keys", str(keys[1]), str(path)])
    assert res.exit_code == 2 and "need the Python package 'cryptography'" in json.loads(res.stdout)["error"]
    res = CliRunner().invoke(app, ["certify", "--signing-key", str(keys[0]["node-a"][0])], env={"KDACTL_DATA_DIR": str(tmp_path / "d")})
    assert res.exit_code == 2 and "cryptography" in res.stderr


def test_no_cryptography_still_checks_what_needs_none(tmp_path, keys, hide_cryptography):
    """Another node's key is refused by its key id alone; a verifier without trusted keys never
    imports cryptography."""
    by_b, by_a = sealed(tmp_path, keys, signed_by="node-b"), sealed(tmp_path, keys, name="a.json")
    hide_cryptography()
    assert verify_trusted(by_b, keys[1]).exit_code == 1
    assert verify(by_a).exit_code == 0


# --- the trusted-keys file and the signing key --------------------------------------------------

KEY_A = base64.b64encode(bytes(range(32))).decode()


@pytest.mark.parametrize("text,problem", [
    ("node-a\n", "line 1: expected 'HOSTNAME BASE64-PUBLIC-KEY', got 1 fields"),
    (f"node-a {KEY_A} extra\n", "line 1: expected 'HOSTNAME BASE64-PUBLIC-KEY', got 3 fields"),
    ("# c\nnode-a not*base64\n", "line 2: the key of node-a is not base64"),
    (f"node-a {base64.b64encode(bytes(31)).decode()}\n", "line 1: the key of node-a is 31 bytes, an Ed25519 public key is 32"),
    (f"node-a {KEY_A}\nnode-b {KEY_A}\n", "line 2: key [0-9a-f]{16} is listed for both node-a and node-b"),
    ("# nothing\n\n", "lists no keys"),
])  # fmt: skip
def test_bad_trusted_keys_file(tmp_path, text, problem):
    path = tmp_path / "trusted"
    path.write_text(text)
    with pytest.raises(UsageError, match=problem):
        signing.read_trusted_keys({}, path)
    res = CliRunner().invoke(app, ["verify", "--trusted-keys", str(path), str(path)])
    assert res.exit_code == 2


def test_trusted_keys_allow_several_keys_per_host(tmp_path):
    other = base64.b64encode(bytes(range(1, 33))).decode()
    t = signing.parse_trusted_keys(f"node-a {KEY_A}\nnode-a {other}\n", "f")
    assert len(t.by_host["node-a"]) == 2 and t.owner(signing.key_id(bytes(range(32)))) == "node-a"


def test_bad_signing_key_fails_before_the_run(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())  # fmt: skip
    cases = {"rsa.pem": (rsa_pem, "expected an Ed25519 private key"), "junk.pem": (b"not a key\n", "not an unencrypted PEM private key")}
    for name, (content, problem) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UsageError, match=problem):
            certify_command(cf.settings(tmp_path), CertifyOptions(signing_key=tmp_path / name), cf.deps(cf.node(1), runner=None))
    with pytest.raises(UsageError, match="KDACTL_SIGNING_KEY .*missing.pem: cannot read"):
        certify_command(cf.settings(tmp_path, KDACTL_SIGNING_KEY=str(tmp_path / "missing.pem")), CertifyOptions(), cf.deps(cf.node(1)))


def test_keygen_writes_an_owner_only_key_once(tmp_path):
    out = tmp_path / "node.pem"
    res = CliRunner().invoke(app, ["keygen", "--out", str(out), "--hostname", "node-a", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (out.stat().st_mode & 0o777) == 0o600 and out.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    trusted = signing.parse_trusted_keys(rep["trusted_keys_line"], "line")
    assert list(trusted.by_host["node-a"]) == [rep["key_id"]] == [signing.read_signer({}, out).key_id]
    before = out.read_bytes()
    res = CliRunner().invoke(app, ["keygen", "--out", str(out)])
    assert res.exit_code == 2 and "exists" in res.stderr and out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["node.pem"]  # no temp file left
    assert CliRunner().invoke(app, ["keygen", "--out", str(tmp_path / "x"), "--hostname", "a b"]).exit_code == 2


def test_keygen_output_appends_to_a_trusted_keys_file(tmp_path):
    """The human form prints a '#' comment and the line, so '>> trusted' is all a fleet needs."""
    res = CliRunner().invoke(app, ["keygen", "--out", str(tmp_path / "k.pem"), "--hostname", "node-a"])
    (tmp_path / "trusted").write_text(res.stdout)
    assert list(signing.read_trusted_keys({}, tmp_path / "trusted").by_host) == ["node-a"]


def test_an_openssl_key_signs(tmp_path):
    openssl = require_tool("openssl", "apt-get install openssl")
    key = tmp_path / "openssl.pem"
    subprocess.run([openssl, "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    der = subprocess.run([openssl, "pkey", "-in", str(key), "-pubout", "-outform", "DER"], check=True, capture_output=True).stdout
    (tmp_path / "trusted").write_text(f"node-a {base64.b64encode(der[-32:]).decode()}\n")
    path = tmp_path / "cert.json"
    cm.write_certificate(path, cm.seal(doc(), None, signing.read_signer({}, key)))
    assert verify_trusted(path, tmp_path / "trusted").exit_code == 0


# --- certify, gate, and the SPEC's steps ---------------------------------------------------------


def test_certify_signs_and_gate_admits_only_under_the_hosts_key(tmp_path, keys):
    s = cf.settings(tmp_path, KDACTL_SIGNING_KEY=str(keys[0]["node-a"][0]))
    certify_command(s, CertifyOptions(), cf.deps(cf.node(8)))  # the fakes' host is node-a
    cert = json.loads((s.data_dir / "cert.json").read_text())
    assert cert["integrity"]["node_signature"]["key_id"] == signer(keys, "node-a").key_id
    trusted_env = {**s.env, signing.TRUSTED_ENV: str(keys[1])}
    assert run_gate(cf.settings(tmp_path, **trusted_env)).exit_code == 0
    # the same certificate, but the trusted file lists node-a's key under node-b and node-b's under node-a
    lines = keys[1].read_text().replace("node-a ", "TMP ").replace("node-b ", "node-a ").replace("TMP ", "node-b ")
    (tmp_path / "swapped").write_text(lines)
    rep = run_gate(cf.settings(tmp_path, **{**trusted_env, signing.TRUSTED_ENV: str(tmp_path / "swapped")}))
    assert rep.exit_code == 1 and "a node's key signs only its own certificate" in rep.failures[0]


def spec_block() -> str:
    spec = (cf.ROOT / "SPEC.md").read_text()
    section = spec.split("### Verifying a certificate by hand", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_the_spec_by_hand_steps_verify_a_certificate(tmp_path, keys):
    require_module("rfc8785", "pip install rfc8785 (the test extra)")
    require_tool("openssl", "apt-get install openssl")
    script = tmp_path / "by-hand.sh"
    script.write_text("set -eu\n" + spec_block())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TRUSTED": str(keys[1])}

    def run(cert: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script)], env={**env, "CERT": str(cert)}, cwd=tmp_path, capture_output=True, text=True, timeout=60)

    good = run(sealed(tmp_path, keys, name="good.json", results=[{**doc()["results"][0], "duration_s": 0.0}]))
    assert good.returncode == 0 and good.stdout.splitlines() == ["digest OK", "Signature Verified Successfully"], good.stderr
    forged = run(sealed(tmp_path, keys, host="node-a", signed_by="node-b", name="forged.json"))
    assert forged.returncode != 0 and "digest OK" in forged.stdout and "Signature Verified Successfully" not in forged.stdout


def test_fleet_ingest_stores_only_certificates_signed_by_their_own_host(tmp_path, keys):
    from tests import fleet_fakes as ff
    from kdactl.fleet.ingest import ingest_command

    own = tmp_path / "own.json"
    cm.write_certificate(own, cm.seal(json.loads(ff.make_cert(tmp_path, "node-a").read_text()), None, signer(keys, "node-a")))
    forged = tmp_path / "forged.json"  # node-a's key vouching for node-b
    cm.write_certificate(forged, cm.seal(json.loads(ff.make_cert(tmp_path, "node-b").read_text()), None, signer(keys, "node-a")))
    rep = ingest_command(cf.settings(tmp_path), [own, forged], db=tmp_path / "f.db", now=lambda: ff.NOW, trusted_keys=keys[1])
    assert rep.added == [str(own)] and rep.exit_code == 1
    assert rep.rejected == [(str(forged), f"signed by node-a's key {signer(keys, 'node-a').key_id}, not by a key of node-b: "
                                          "a node's key signs only its own certificate")]  # fmt: skip


def test_k8s_labels_need_the_hosts_own_signature(tmp_path, keys):
    from tests import fleet_fakes as ff
    from kdactl.integrations.k8s import labels_command

    cert = tmp_path / "cert.json"
    cm.write_certificate(cert, cm.seal(json.loads(ff.make_cert(tmp_path, "node-a").read_text()), None, signer(keys, "node-b")))
    (tmp_path / "features.d").mkdir()
    rep = labels_command(cf.settings(tmp_path, **{signing.TRUSTED_ENV: str(keys[1])}), tmp_path / "features.d", cert, now=lambda: ff.NOW)
    assert rep.labels["kdactl.io/certified"] == "false" and "not by a key of node-a" in rep.reasons[0]
