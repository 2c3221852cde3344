"""kdactl fleet ingest: integrity checked per certificate, tampered ones rejected, idempotent."""

import json

from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.fleet.store import Store, ingest_command
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

import pytest


def _s(tmp_path, **env):
    return cf.settings(tmp_path, **env)


def test_ingest_real_and_fake_certificates_then_again_adds_nothing(tmp_path):
    a = ff.make_cert(tmp_path, "gpu-a", when=ff.recent())
    r = ingest_command(_s(tmp_path), [ff.DATA, a])  # the clock now: certificates added to DATA later are not "future"
    assert r.exit_code == 0 and len(r.added) >= 3 and not r.rejected, r.rejected
    again = ingest_command(_s(tmp_path), [ff.DATA, a])
    assert again.added == [] and len(again.already) == len(r.added) and again.total == r.total
    assert (tmp_path / "data" / "fleet.db").is_file()  # default: <data dir>/fleet.db


def test_tampered_certificate_is_rejected_with_reason_and_the_rest_ingested(tmp_path):
    a = ff.make_cert(tmp_path, "gpu-a")
    bad = ff.tamper(a)
    corrupt = tmp_path / "certs" / "corrupt.json"
    corrupt.write_text(a.read_text()[:-40])
    r = ingest_command(_s(tmp_path), [bad, a, corrupt], db=tmp_path / "f.db", now=lambda: ff.NOW)
    assert r.exit_code == 1 and r.added == [str(a)]
    reasons = dict(r.rejected)
    assert "digest mismatch" in reasons[str(bad)] and "changed after it was issued" in reasons[str(bad)]
    assert "not valid JSON" in reasons[str(corrupt)]


def test_expired_certificate_is_history_not_rejected(tmp_path):
    a = ff.make_cert(tmp_path, "gpu-a", lifetime=1)
    r = ingest_command(_s(tmp_path), [a], db=tmp_path / "f.db", now=lambda: ff.after(30))
    assert r.exit_code == 0 and r.added == [str(a)]


def test_signature_required_when_a_key_is_configured(tmp_path):
    a = ff.make_cert(tmp_path, "gpu-a")
    r = ingest_command(_s(tmp_path, KDACTL_CERT_KEY="k1"), [a], db=tmp_path / "f.db", now=lambda: ff.NOW)
    assert r.exit_code == 1 and "signature required" in r.rejected[0][1]
    signed = tmp_path / "signed.json"
    cm.write_certificate(signed, cm.seal(json.loads(a.read_text()), b"k1"))
    assert ingest_command(_s(tmp_path), [signed], db=tmp_path / "g.db", now=lambda: ff.NOW).rejected[0][1].startswith("the certificate is signed")
    assert ingest_command(_s(tmp_path, KDACTL_CERT_KEY="k1"), [signed], db=tmp_path / "h.db", now=lambda: ff.NOW).exit_code == 0


def test_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        ingest_command(_s(tmp_path), [tmp_path / "nope.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no certificates"):
        ingest_command(_s(tmp_path), [tmp_path / "empty"])


def test_store_keeps_documents_in_issue_order(tmp_path):
    late = ff.make_cert(tmp_path, "gpu-a", when=ff.after(2))
    early = ff.make_cert(tmp_path, "gpu-a", when=ff.after(1))
    ingest_command(_s(tmp_path), [late, early], db=tmp_path / "f.db", now=lambda: ff.after(3))
    with Store(tmp_path / "f.db") as st:
        docs = st.documents()
        assert [d["issued_at"] for d in docs] == sorted(d["issued_at"] for d in docs)
        assert len(st.documents(since=ff.after(1.5))) == 1


def test_cli_ingest_json_and_exit_codes(tmp_path, monkeypatch):
    monkeypatch.setenv("KDACTL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("KDACTL_CERT_KEY", raising=False)
    a = ff.make_cert(tmp_path, "gpu-a", when=ff.recent())
    bad = ff.tamper(a)
    res = CliRunner().invoke(app, ["fleet", "ingest", str(a), str(bad), "--db", str(tmp_path / "f.db"), "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["added"] == [str(a)] and doc["rejected"][0]["path"] == str(bad)
    res = CliRunner().invoke(app, ["fleet", "ingest", str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert "--db" in CliRunner().invoke(app, ["fleet", "ingest", "--help"]).stdout
