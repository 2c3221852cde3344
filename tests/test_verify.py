"""kdactl verify: digest, HMAC signature, expiry and schema; one changed byte is always caught."""

import hashlib
import hmac
import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.certify.command import CertifyOptions, certify_command
from kdactl.certify.verify import verify_command
from kdactl.cli import app
from tests import certify_fakes as cf


def doc(**kw):
    base = {
        "schema": cm.SCHEMA, "verdict": "certified", "reason": "8 checks, none failed", "scope": "full",
        "issued_at": cm.stamp(cf.NOW), "expires_at": cm.stamp(cf.NOW + timedelta(days=7)),
        "node": {"hostname": "node-a", "fingerprint": {"gpu_uuids": [cf.uuid(0)], "driver_version": "580.159.04",
                                                       "cuda_toolkit": "13.0", "artifact_sha256": {"sm_90a": cf.SHA}}},
        "versions": {"kdactl": "0.1.0", "driver": "580.159.04"},
        "gpus": [{"index": 0, "uuid": cf.uuid(0), "name": "NVIDIA H200", "sku": "H200", "cc": "9.0", "target": "sm_90a",
                  "artifact_sha256": cf.SHA}],
        "results": [{"check": "suite", "gpu": 0, "status": "pass", "duration_s": 1.5, "message": "ünïcode ok"}],
    }  # fmt: skip
    base.update(kw)
    return base


def write(tmp_path, d, key=None, name="cert.json"):
    path = tmp_path / name
    cm.write_certificate(path, cm.seal(d, key))
    return path


def verify(path, key_file=None, env=None, now=cf.NOW):
    return verify_command(cf.settings(path.parent, **(env or {})), path, key_file, now=lambda: now)


def test_round_trip(tmp_path):
    rep = verify(write(tmp_path, doc()))
    assert rep.exit_code == 0 and rep.failures == [] and "unsigned" in rep.notes[0]
    assert rep.to_json()["verdict"] == "certified"


def test_canonical_form_ignores_whitespace_and_key_order(tmp_path):
    sealed = cm.seal(doc(), None)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dict(reversed(list(sealed.items()))), indent=7))
    assert verify(path).exit_code == 0


@pytest.mark.parametrize("key", [None, b"k"])
def test_every_single_byte_change_is_rejected(tmp_path, key):
    path = write(tmp_path, doc(), key=key)
    raw = path.read_bytes()
    # every byte that is not layout (indentation/newlines do not change the canonical form)
    positions = [i for i, b in enumerate(raw) if chr(b) not in " \n"]
    for i in positions:
        changed = bytearray(raw)
        changed[i] = ord("X") if raw[i] != ord("X") else ord("Y")
        path.write_bytes(bytes(changed))
        rep = verify(path, env={"KDACTL_CERT_KEY": "k"} if key else {})
        assert rep.exit_code == 1, f"byte {i} ({chr(raw[i])!r}) changed and verify passed"


def test_digest_mismatch_reason(tmp_path):
    path = write(tmp_path, doc())
    d = json.loads(path.read_text())
    d["verdict"] = "certified" if d["verdict"] != "certified" else "inconclusive"
    path.write_text(json.dumps(d))
    rep = verify(path)
    assert rep.exit_code == 1 and any("digest mismatch" in f for f in rep.failures)


def test_recomputed_digest_without_key_is_caught_by_signature(tmp_path):
    path = write(tmp_path, doc(), key=b"k")
    d = json.loads(path.read_text())
    d["verdict"] = "certified"
    d["results"][0]["status"] = "pass"
    d["gpus"][0]["artifact_sha256"] = "00" * 32
    d["integrity"]["sha256"] = cm.digest(d)  # the forger fixes the digest but has no key
    path.write_text(json.dumps(d))
    rep = verify(path, env={"KDACTL_CERT_KEY": "k"})
    assert rep.exit_code == 1 and any("signature mismatch" in f for f in rep.failures)


def test_expired_and_future(tmp_path):
    path = write(tmp_path, doc())
    rep = verify(path, now=cf.NOW + timedelta(days=7, seconds=1))
    assert rep.exit_code == 1 and rep.failures[0].startswith("expired")
    rep = verify(path, now=cf.NOW - timedelta(hours=1))
    assert rep.exit_code == 1 and "future" in rep.failures[0]


def test_hmac_signature(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("correct horse\n")
    path = write(tmp_path, doc(), key=b"correct horse")
    assert verify(path, key_file=key_file).exit_code == 0
    assert verify(path, env={"KDACTL_CERT_KEY": "correct horse"}).exit_code == 0
    wrong = verify(path, env={"KDACTL_CERT_KEY": "other"})
    assert wrong.exit_code == 1 and "signed with key" in wrong.failures[0]
    with pytest.raises(cm.KeyRequired, match="KDACTL_CERT_KEY"):
        verify(path)  # a signature nobody checks could have been changed: exit 2, configure the key


# --- certificates sealed before RFC 8785 -------------------------------------------------------


def legacy_seal(d, key=None):
    """The seal before RFC 8785, written out here as that rule said (not through kdactl's code)."""
    body = {k: v for k, v in d.items() if k != "integrity"}
    data = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    sig = None if key is None else {"algorithm": "hmac-sha256", "key_id": hashlib.sha256(key).hexdigest()[:16],
                                    "value": hmac.new(key, data, hashlib.sha256).hexdigest()}  # fmt: skip
    integrity = {"algorithm": "sha256", "canonical": "json-sorted-keys-no-whitespace-utf8",
                 "sha256": hashlib.sha256(data).hexdigest(), "signature": sig}  # fmt: skip
    return {**body, "integrity": integrity}


RECORDED = sorted((cf.ROOT / "tests" / "data" / "certs").glob("*.json"))


@pytest.mark.parametrize("source", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_legacy_certificates_still_verify(tmp_path, source):
    """Certificates of nodes certified before the upgrade: the new rule alone would refuse them."""
    path = Path(shutil.copy(source, tmp_path / source.name))
    d = json.loads(path.read_text())
    assert d["integrity"]["canonical"] == cm.LEGACY_CANONICAL and cm.digest(d) != d["integrity"]["sha256"]
    rep = verify(path, now=cm.parse_stamp(d["issued_at"]) + timedelta(hours=1))
    assert rep.exit_code == 0 and rep.failures == []


def test_legacy_hmac_certificate_verifies_and_changes_are_caught(tmp_path):
    d = doc(results=[{**doc()["results"][0], "duration_s": 0.0}])  # json.dumps writes 0.0, RFC 8785 writes 0
    path = tmp_path / "old.json"
    cm.write_certificate(path, legacy_seal(d, b"k"))
    assert verify(path, env={"KDACTL_CERT_KEY": "k"}).exit_code == 0
    changed = json.loads(path.read_text())
    changed["verdict"] = "inconclusive"
    path.write_text(json.dumps(changed))
    assert any("digest mismatch" in f for f in verify(path, env={"KDACTL_CERT_KEY": "k"}).failures)
    changed["integrity"]["sha256"] = legacy_seal(changed)["integrity"]["sha256"]  # the forger fixes the digest
    path.write_text(json.dumps(changed))
    assert verify(path, env={"KDACTL_CERT_KEY": "k"}).failures == ["signature mismatch: the certificate was changed after it was signed"]


def test_new_certificates_use_rfc8785(tmp_path):
    d = json.loads(write(tmp_path, doc(results=[{**doc()["results"][0], "duration_s": 0.0}])).read_text())
    assert d["integrity"]["canonical"] == "rfc8785"
    assert d["integrity"]["sha256"] != legacy_seal(d)["integrity"]["sha256"]


def test_unsigned_rejected_when_key_configured(tmp_path):
    rep = verify(write(tmp_path, doc()), env={"KDACTL_CERT_KEY": "k"})
    assert rep.exit_code == 1 and "signature required" in rep.failures[0]


@pytest.mark.parametrize("change,match", [
    ({"schema": "kdactl.cert/v0"}, "schema"), ({"verdict": "maybe"}, "verdict"), ({"gpus": {}}, "gpus"),
    ({"expires_at": "tomorrow"}, "ISO 8601"),
])  # fmt: skip
def test_schema_checks(tmp_path, change, match):
    rep = verify(write(tmp_path, doc(**change)))
    assert rep.exit_code == 1 and match in rep.failures[0]


def test_missing_field(tmp_path):
    d = doc()
    del d["versions"]
    rep = verify(write(tmp_path, d))
    assert rep.exit_code == 1 and "lacks versions" in rep.failures[0]


def test_not_json_is_rejected_not_unreadable(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(b"\xff{not json")
    rep = verify(path)
    assert rep.exit_code == 1 and "not valid JSON" in rep.failures[0]


def test_cli_exit_codes(tmp_path):
    env = {"KDACTL_CERT_KEY": "", "KDACTL_DATA_DIR": str(tmp_path)}
    fresh = cm.seal(doc(issued_at=cm.stamp(cm.now_utc()), expires_at=cm.stamp(cm.now_utc() + timedelta(days=1))), None)
    good = tmp_path / "good.json"
    cm.write_certificate(good, fresh)
    r = CliRunner().invoke(app, ["verify", str(good), "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.stdout)["valid"] is True
    raw = good.read_bytes()
    i = raw.index(b"node-a")
    good.write_bytes(raw[:i] + b"m" + raw[i + 1 :])
    r = CliRunner().invoke(app, ["verify", str(good)], env=env)
    assert r.exit_code == 1 and "INVALID" in r.stdout and "digest mismatch" in r.stdout
    r = CliRunner().invoke(app, ["verify", str(tmp_path / "missing.json"), "--json"], env=env)
    assert r.exit_code == 2 and "cannot read certificate" in json.loads(r.stdout)["error"]
    r = CliRunner().invoke(app, ["verify", str(good), "--key-file", str(tmp_path / "nokey")], env=env)
    assert r.exit_code == 2
    signed = tmp_path / "signed.json"
    cm.write_certificate(signed, cm.seal(fresh, b"k"))
    assert CliRunner().invoke(app, ["verify", str(signed)], env=env).exit_code == 2
    assert CliRunner().invoke(app, ["verify", str(signed)], env={**env, "KDACTL_CERT_KEY": "k"}).exit_code == 0


@pytest.mark.parametrize("field, value, match", [
    ("node", "node-a", "node is a string, expected an object"),
    ("gpus", {"0": {}}, "gpus is an object, expected a list"),
    ("results", [["suite", "pass"]], "results[0] is a list, expected an object"),
    ("results", [{"check": "suite", "gpu": "0", "status": "pass"}], "results[0].gpu is a string, expected an integer or null"),
])  # fmt: skip
def test_well_sealed_document_of_the_wrong_shape_is_invalid_in_one_line(tmp_path, field, value, match):
    """A digest proves only that nothing changed since sealing: the shape is checked too, and the
    rendering of such a document (text and --json) ends as exit 1 with the reason, not a traceback."""
    path = write(tmp_path, doc(**{field: value}))
    rep = verify(path)
    assert rep.exit_code == 1 and any(match in f for f in rep.failures), rep.failures
    env = {"KDACTL_CERT_KEY": "", "KDACTL_DATA_DIR": str(tmp_path)}
    for args in (["verify", str(path)], ["verify", str(path), "--json"]):
        r = CliRunner().invoke(app, args, env=env)
        assert r.exit_code == 1 and "Traceback" not in r.output and match in r.stdout, r.output


def _built(tmp_path):
    s = cf.settings(tmp_path)
    certify_command(s, CertifyOptions(), cf.deps(cf.node(8)))
    return s.data_dir / "cert.json"


@pytest.mark.parametrize("where, value, problem", cf.WRONG_TYPES)
def test_sealed_wrong_type_below_the_top_is_invalid(tmp_path, where, value, problem):
    path = cf.reseal_changed(_built(tmp_path), where, value)
    rep = verify(path)
    assert rep.exit_code == 1 and problem in rep.failures, rep.failures


@pytest.mark.parametrize("token, problem", cf.BAD_TOKENS)
def test_non_finite_numbers_and_deep_nesting_are_invalid_not_internal_errors(tmp_path, token, problem):
    path = cf.reseal_changed(_built(tmp_path), token=token)
    rep = verify(path)
    assert rep.exit_code == 1 and len(rep.failures) == 1 and problem in rep.failures[0], rep.failures
    r = CliRunner().invoke(app, ["verify", str(path)], env={"KDACTL_CERT_KEY": "", "KDACTL_DATA_DIR": str(tmp_path)})
    assert r.exit_code == 1 and "INVALID" in r.stdout and problem in r.stdout, r.output


def test_cli_names_the_problem_of_a_sealed_wrong_type(tmp_path):
    path = cf.reseal_changed(_built(tmp_path), ("node", "hostname"), ["node-a", "node-b"])
    r = CliRunner().invoke(app, ["verify", str(path), "--json"], env={"KDACTL_CERT_KEY": "", "KDACTL_DATA_DIR": str(tmp_path)})
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["valid"] is False and out["failures"] == ["node.hostname is a list, expected a string"]
