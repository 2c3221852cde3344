"""kdactl fleet ingest: integrity checked per certificate, tampered ones rejected, idempotent; one bad
document never costs the batch; concurrent ingests wait; SQLite and a real PostgreSQL alike."""

import json
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timedelta

from typer.testing import CliRunner

from kdactl.certify import certificate as cm
from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.fleet.ingest import ingest_command
from kdactl.fleet.store import Store
from tests import certify_fakes as cf
from tests import fleet_fakes as ff

import pytest


def _s(tmp_path, **env):
    return cf.settings(tmp_path, **env)


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    with ff.store_target(request.param, tmp_path) as t:
        yield t


def test_ingest_real_and_fake_certificates_then_again_adds_nothing(tmp_path):
    a = ff.make_cert(tmp_path, "gpu-a", when=ff.recent())
    r = ingest_command(_s(tmp_path), [ff.DATA, a])  # the clock now: certificates added to DATA later are not "future"
    assert r.exit_code == 0 and len(r.added) >= 3 and not r.rejected, r.rejected
    again = ingest_command(_s(tmp_path), [ff.DATA, a])
    assert again.added == [] and len(again.already) == len(r.added) and again.total == r.total
    assert (tmp_path / "data" / "fleet.db").is_file()  # default: <data dir>/fleet.db


def test_tampered_certificate_is_rejected_with_reason_and_the_rest_ingested(tmp_path, target):
    a = ff.make_cert(tmp_path, "gpu-a")
    bad = ff.tamper(a)
    corrupt = tmp_path / "certs" / "corrupt.json"
    corrupt.write_text(a.read_text()[:-40])
    r = ingest_command(_s(tmp_path), [bad, a, corrupt], db=target, now=lambda: ff.NOW)
    assert ingest_command(_s(tmp_path), [a], db=target, now=lambda: ff.NOW).already == [str(a)]
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


def test_store_keeps_columns_perf_and_problems(tmp_path, target):
    a = ff.make_cert(tmp_path, "gpu-a", when=ff.after(1))
    c = ff.make_cert(tmp_path, "gpu-c", when=ff.after(2), fault="wrong-result:direct")
    r = ingest_command(_s(tmp_path), [a, c], db=target, now=lambda: ff.after(3))
    assert r.exit_code == 0 and r.total == 2
    with Store(target) as st:
        rows = st.db.rows("SELECT node, sku, verdict, issued_at, gpus FROM certs ORDER BY issued_at")
        assert rows == [("gpu-a", "H200", "certified", "2026-12-06T12:00:00Z", 2), ("gpu-c", "H200", "not_certified", "2026-12-07T12:00:00Z", 2)]
        assert st.db.rows("SELECT COUNT(*) FROM perf")[0][0] == 8  # 2 shapes x 2 GPUs x 2 certificates
        kinds = {k for (k,) in st.db.rows("SELECT kind FROM problems")}
        assert kinds == {"fail: suite.test_routes::test_route_smoke[direct]", "fault injected"}
        from kdactl.fleet.store import decode

        assert decode(st.db.rows("SELECT doc FROM docs ORDER BY cert_id")[0][0]) == json.loads(a.read_text())


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
    monkeypatch.setenv("KDACTL_FLEET_DB", str(tmp_path / "env.db"))  # the default --db, e.g. a PostgreSQL URL
    assert json.loads(CliRunner().invoke(app, ["fleet", "ingest", str(a), "--json"]).stdout)["db"] == str(tmp_path / "env.db")


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


def test_a_store_of_the_older_layout_is_carried_over_naming_bad_rows(tmp_path):
    """A store written before the migrations (whole documents in one table, no shape check): its rows
    are extracted again, and the one that is not a certificate is left out and named."""
    a = ff.make_cert(tmp_path, "gpu-a")
    good = json.loads(a.read_text())
    bad = json.loads(_resealed(tmp_path, a, "bad.json", gpus="8x H200", node="gpu-b").read_text())
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE certs (digest TEXT PRIMARY KEY, hostname TEXT, verdict TEXT NOT NULL, scope TEXT, issued_at TEXT NOT NULL, "
                     "expires_at TEXT NOT NULL, source TEXT NOT NULL, ingested_at TEXT NOT NULL, doc TEXT NOT NULL)")
        conn.execute("CREATE INDEX certs_host_time ON certs (hostname, issued_at)")
        for doc, source in ((good, "a.json"), (bad, "old.json")):
            conn.execute("INSERT INTO certs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (doc["integrity"]["sha256"], "h", doc["verdict"], "full", doc["issued_at"], doc["expires_at"], source,
                          doc["issued_at"], json.dumps(doc)))  # fmt: skip
    for fmt in ("table", "json", "markdown", "html"):
        r = CliRunner().invoke(app, ["fleet", "report", "--db", str(db), "--format", fmt])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        assert "old.json" in r.stdout and "gpus is a string" in r.stdout
    report = json.loads(CliRunner().invoke(app, ["fleet", "report", "--db", str(db), "--json"]).stdout)
    assert report["certificates"] == 1 and report["nodes"] == 1 and len(report["left_out"]) == 1
    with Store(db) as st:
        assert st.db.rows("SELECT version FROM schema_version") == [(1,)] and not st.db.has_table("certs_before_v1")


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


def test_a_list_hostname_is_rejected_by_name_and_the_batch_goes_on(tmp_path, target):
    a = ff.make_cert(tmp_path, "gpu-a")
    bad = ff.resealed(a, tmp_path / "certs" / "list-host.json", lambda d: d["node"].update(hostname=["gpu-x", "gpu-y"]))
    c = ff.make_cert(tmp_path, "gpu-c")
    r = ingest_command(_s(tmp_path), [a, bad, c], db=target, now=lambda: ff.NOW)
    assert r.exit_code == 1 and r.added == [str(a), str(c)] and r.total == 2 and not r.stopped
    assert [p for p, _ in r.rejected] == [str(bad)] and "hostname" in r.rejected[0][1]


def test_ingest_waits_for_another_writer_instead_of_failing(tmp_path):
    """Another ingest holds the write lock for longer than SQLite's default 5 s wait."""
    db = tmp_path / "f.db"
    a, b = ff.make_cert(tmp_path, "gpu-a"), ff.make_cert(tmp_path, "gpu-b")
    ingest_command(_s(tmp_path), [a], db=db, now=lambda: ff.NOW)
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Timer(6.0, lambda: other.execute("COMMIT"))
    released.start()
    try:
        t0 = time.monotonic()
        r = ingest_command(_s(tmp_path), [b], db=db, now=lambda: ff.NOW)
    finally:
        released.join()
        other.close()
    assert r.exit_code == 0 and r.added == [str(b)] and r.total == 2, r.stopped
    assert time.monotonic() - t0 >= 5.5  # it did wait for the lock


def test_concurrent_ingest_processes_store_everything(tmp_path, target):
    """Two `kdactl fleet ingest` processes at once into one new store: both succeed, nothing is lost."""
    one = [ff.make_cert(tmp_path, f"gpu-{i}", name=f"one/{i}.json", when=ff.recent()) for i in range(12)]
    two = [ff.make_cert(tmp_path, f"gpu-{i}", name=f"two/{i}.json", when=ff.recent() - timedelta(days=1)) for i in range(12)]
    cmd = [sys.executable, "-m", "kdactl", "fleet", "ingest", "--db", target, "--json"]
    env = {**cf.settings(tmp_path).env, "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([*cmd, str(tmp_path / "certs" / d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for d in ("one", "two")]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out, err)
        assert len(json.loads(out)["added"]) == 12
    with Store(target) as st:
        assert st.count() == len(one) + len(two)


@pytest.mark.parametrize("name, text", [
    ("nan.json", lambda t: t.replace('"duration_s": 0.01', '"duration_s": NaN', 1)),
    ("infinity.json", lambda t: t.replace('"duration_s": 0.01', '"duration_s": Infinity', 1)),
    ("huge.json", lambda t: t.replace('"duration_s": 0.01', '"duration_s": 1e400', 1)),
    ("deep.json", lambda t: t.replace('"warnings": []', '"warnings": ' + "[" * 5000 + "]" * 5000, 1)),
])  # fmt: skip
def test_ingest_names_and_skips_a_document_the_schema_refuses(tmp_path, name, text):
    a = ff.make_cert(tmp_path, "gpu-a", when=ff.recent())
    bad = tmp_path / "certs" / name
    bad.write_text(text(a.read_text()))
    assert bad.read_text() != a.read_text()
    c = ff.make_cert(tmp_path, "gpu-c", when=ff.recent())
    res = CliRunner().invoke(app, ["fleet", "ingest", str(a), str(bad), str(c), "--db", str(tmp_path / "f.db"), "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["added"] == [str(a), str(c)] and doc["certificates_in_store"] == 2
    assert [r["path"] for r in doc["rejected"]] == [str(bad)]
