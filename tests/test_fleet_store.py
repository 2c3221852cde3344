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


def _resealed(tmp_path, source, name, **changes):
    """A digest-valid certificate (sealed again after the change) of the wrong shape."""
    doc = json.loads(source.read_text())
    doc.pop("integrity")
    doc.update(changes)
    path = tmp_path / "certs" / name
    cm.write_certificate(path, cm.seal(doc, None))
    return path


@pytest.mark.parametrize("changes, reason", [
    ({"gpus": "8x H200"}, "gpus is a string, expected a list"),
    ({"results": {"suite": "pass"}}, "results is an object, expected a list"),
    ({"node": "gpu-a"}, "node is a string, expected an object"),
    ({"results": [{"check": "suite", "gpu": 0, "status": "ok"}]}, "results[0].status 'ok' is not one of"),
])  # fmt: skip
def test_ingest_rejects_a_sealed_certificate_of_the_wrong_shape(tmp_path, changes, reason):
    a = ff.make_cert(tmp_path, "gpu-a")
    bad = _resealed(tmp_path, a, "bad.json", **changes)
    r = ingest_command(_s(tmp_path), [bad, a], db=tmp_path / "f.db", now=lambda: ff.NOW)
    assert r.exit_code == 1 and r.added == [str(a)] and reason in dict(r.rejected)[str(bad)]


def test_report_survives_a_bad_row_already_in_the_store(tmp_path):
    """A store written before ingest checked the shape: the row is left out and named, the rest reported."""
    a = ff.make_cert(tmp_path, "gpu-a")
    db = tmp_path / "f.db"
    ingest_command(_s(tmp_path), [a], db=db, now=lambda: ff.NOW)
    bad = json.loads(_resealed(tmp_path, a, "bad.json", gpus="8x H200", node="gpu-b").read_text())
    with Store(db) as st:
        st.conn.execute("INSERT INTO certs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (bad["integrity"]["sha256"], "gpu-b", "certified", "full", bad["issued_at"], bad["expires_at"],
                         "old.json", bad["issued_at"], json.dumps(bad)))  # fmt: skip
        st.conn.commit()
    for fmt in ("table", "json", "markdown", "html"):
        r = CliRunner().invoke(app, ["fleet", "report", "--db", str(db), "--format", fmt])
        assert r.exit_code in (0, 1) and "Traceback" not in r.output, r.output
        assert "old.json" in r.stdout and "gpus is a string" in r.stdout
    report = json.loads(CliRunner().invoke(app, ["fleet", "report", "--db", str(db), "--json"]).stdout)
    assert report["certificates"] == 1 and len(report["left_out"]) == 1


def test_ingest_failing_part_way_says_what_was_stored(tmp_path, monkeypatch):
    import sqlite3

    a, b, c = (ff.make_cert(tmp_path, h) for h in ("gpu-a", "gpu-b", "gpu-c"))
    real_add = Store.add

    def add(self, doc, source, now):
        if source == str(b):
            raise sqlite3.OperationalError("database or disk is full")
        return real_add(self, doc, source, now)

    monkeypatch.setattr(Store, "add", add)
    r = ingest_command(_s(tmp_path), [a, b, c], db=tmp_path / "f.db", now=lambda: ff.NOW)
    assert r.exit_code == 3 and r.added == [str(a)] and r.total == 1
    assert f"failed at {b}" in r.stopped and "disk is full" in r.stopped and "2 files not ingested" in r.stopped
    from rich.console import Console

    console = Console(record=True, width=400)
    r.render(console)
    assert f"stored before it: {a}" in console.export_text()
