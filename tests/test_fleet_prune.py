"""kdactl fleet prune: retention per node (--keep N) and by age (--older-than DAYS); a node's latest
certificate, the one the report reads, is never removed. SQLite and a real PostgreSQL."""

import json

import pytest
from typer.testing import CliRunner

from kdactl.cli import app
from kdactl.errors import UsageError
from kdactl.fleet.ingest import ingest_command
from kdactl.fleet.prune import prune_command
from kdactl.fleet.report import build_report
from kdactl.fleet.store import Store
from tests import certify_fakes as cf
from tests import fleet_fakes as ff


@pytest.fixture(params=["sqlite", "postgresql"])
def history(request, tmp_path):
    """gpu-a certified on days -40, -20, -3, -2, -1; gpu-b once, 50 days ago (its only certificate)."""
    with ff.store_target(request.param, tmp_path) as target:
        paths = [ff.make_cert(tmp_path, "gpu-a", when=ff.after(-d)) for d in (40, 20, 3, 2, 1)]
        paths.append(ff.make_cert(tmp_path, "gpu-b", when=ff.after(-50)))
        assert ingest_command(cf.settings(tmp_path), paths, db=target, now=lambda: ff.NOW).total == 6
        yield target


def _issued(target):
    with Store(target) as st:
        return st.db.rows("SELECT node, issued_at FROM certs ORDER BY node, issued_at")


def test_keep_newest_per_node(tmp_path, history):
    r = prune_command(cf.settings(tmp_path), history, keep=2, now=lambda: ff.NOW)
    assert (r.removed, r.kept) == (3, 3)
    assert _issued(history) == [("gpu-a", "2026-12-03T12:00:00Z"), ("gpu-a", "2026-12-04T12:00:00Z"), ("gpu-b", "2026-10-16T12:00:00Z")]
    with Store(history) as st:  # the removed certificates' rows went with them
        assert st.db.rows("SELECT COUNT(*) FROM perf")[0][0] == 3 * 4 and st.db.rows("SELECT COUNT(*) FROM docs")[0][0] == 3


def test_older_than_keeps_each_nodes_latest(tmp_path, history):
    dry = prune_command(cf.settings(tmp_path), history, older_than=10, dry_run=True, now=lambda: ff.NOW)
    assert (dry.removed, dry.kept, len(_issued(history))) == (2, 4, 6)
    r = prune_command(cf.settings(tmp_path), history, older_than=10, now=lambda: ff.NOW)
    assert r.removed == 2 and [n for n, _ in _issued(history)] == ["gpu-a", "gpu-a", "gpu-a", "gpu-b"]  # b's only one stays
    with Store(history) as st:
        assert build_report(st, ff.NOW).nodes == 2


def test_both_limits_and_usage_errors(tmp_path, history):
    assert prune_command(cf.settings(tmp_path), history, keep=4, older_than=10, now=lambda: ff.NOW).removed == 2
    for kw, msg in (({}, "--keep N"), ({"keep": 0}, "--keep must be at least 1"), ({"older_than": -1}, "--older-than")):
        with pytest.raises(UsageError, match=msg):
            prune_command(cf.settings(tmp_path), history, **kw)


def test_cli_prune(tmp_path, history):
    res = CliRunner().invoke(app, ["fleet", "prune", "--db", history, "--keep", "1", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["removed"] == 4
    assert CliRunner().invoke(app, ["fleet", "prune", "--db", history]).exit_code == 2
    assert CliRunner().invoke(app, ["fleet", "prune", "--db", str(tmp_path / "none.db"), "--keep", "1"]).exit_code == 2
