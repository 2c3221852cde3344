"""kdactl slurm drain/resume with a fake scontrol (recorded Slurm 22.05 output in tests/data/slurm)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdactl.integrations import slurm
from kdactl.cli import app
from kdactl.errors import Inconclusive, ToolMissing, UsageError
from tests import certify_fakes as cf

DATA = Path(__file__).resolve().parent / "data" / "slurm"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


class FakeScontrol:
    """show node -> the recorded output; update -> recorded as a call."""

    def __init__(self, show: str, rc: int = 0, update_rc: int = 0):
        self.show, self.rc, self.update_rc, self.calls = show, rc, update_rc, []

    def run(self, argv):
        self.calls.append(argv)
        if argv[1] == "show":
            return (self.rc, self.show, "") if self.rc == 0 else (self.rc, "", self.show)
        return self.update_rc, "", "" if self.update_rc == 0 else "slurm_update error: Invalid node name specified"


def _s(tmp_path, **env):
    return cf.settings(tmp_path, SLURMD_NODENAME="vm", **env)


def test_parse_show_node_recorded_output():
    idle = slurm.parse_show_node(recorded("show-node-idle.txt"), "vm")
    assert idle.state == "IDLE" and idle.reason == "" and not idle.drained
    ours = slurm.parse_show_node(recorded("show-node-drained-kdactl.txt"), "vm")
    assert ours.drained and ours.owned and ours.reason == "kdactl: gate failed: no certificate at /var/lib/kdactl/cert.json"
    ops = slurm.parse_show_node(recorded("show-node-drained-ops.txt"), "vm")
    assert ops.drained and not ops.owned and ops.reason == "maint by ops"
    with pytest.raises(Inconclusive, match="no State="):
        slurm.parse_show_node("garbage", "vm")


def test_drain_uses_owned_reason(tmp_path):
    fake = FakeScontrol(recorded("show-node-idle.txt"))
    rep = slurm.drain_command(_s(tmp_path), "gate failed: expired", runner=fake)
    assert fake.calls[-1] == ["scontrol", "update", "nodename=vm", "state=drain", "reason=kdactl: gate failed: expired"]
    assert rep.done == "drained" and rep.exit_code == 0
    assert slurm.owned_reason("kdactl: x") == "kdactl: x" and slurm.owned_reason(None).startswith("kdactl: ")
    assert len(slurm.owned_reason("y" * 500)) == slurm.MAX_REASON


def test_drain_keeps_an_operators_drain(tmp_path):
    fake = FakeScontrol(recorded("show-node-drained-ops.txt"))
    rep = slurm.drain_command(_s(tmp_path), "gate failed", runner=fake)
    assert rep.done == "kept" and all(c[1] == "show" for c in fake.calls)


def test_resume_only_kdactls_drain(tmp_path):
    ours = FakeScontrol(recorded("show-node-drained-kdactl.txt"))
    assert slurm.resume_command(_s(tmp_path), runner=ours).done == "resumed"
    assert ours.calls[-1] == ["scontrol", "update", "nodename=vm", "state=resume"]
    ops = FakeScontrol(recorded("show-node-drained-ops.txt"))
    rep = slurm.resume_command(_s(tmp_path), runner=ops)
    assert rep.done == "kept" and "maint by ops" in rep.message and len(ops.calls) == 1
    idle = FakeScontrol(recorded("show-node-idle.txt"))
    assert slurm.resume_command(_s(tmp_path), runner=idle).done == "nothing" and len(idle.calls) == 1


def test_scontrol_errors_are_inconclusive(tmp_path):
    with pytest.raises(Inconclusive, match="Node nope not found"):
        slurm.resume_command(_s(tmp_path), node="nope", runner=FakeScontrol("Node nope not found", rc=1))
    with pytest.raises(Inconclusive, match="exited 1"):
        slurm.drain_command(_s(tmp_path), runner=FakeScontrol(recorded("show-node-idle.txt"), update_rc=1))
    with pytest.raises(ToolMissing):
        slurm.SubprocessRunner().run(["kdactl-no-such-scontrol", "show"])
    with pytest.raises(UsageError, match="--reason"):
        slurm.drain_command(_s(tmp_path), "  ", runner=FakeScontrol(""))


def test_node_name(monkeypatch):
    assert slurm.this_node({"SLURMD_NODENAME": "gpu17"}) == "gpu17"
    assert slurm.this_node({"SLURMD_NODENAME": "gpu17"}, "gpu18") == "gpu18"
    monkeypatch.setattr(slurm.socket, "gethostname", lambda: "gpu19.cluster.example")
    assert slurm.this_node({}) == "gpu19"


def test_cli(tmp_path, monkeypatch):
    fake = FakeScontrol(recorded("show-node-drained-ops.txt"))
    monkeypatch.setattr(slurm, "SubprocessRunner", lambda *a, **k: fake)
    monkeypatch.setenv("SLURMD_NODENAME", "vm")
    res = CliRunner().invoke(app, ["slurm", "resume", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["result"] == "kept"
    res = CliRunner().invoke(app, ["slurm", "drain", "--reason", "x", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["result"] == "kept"
    fake.rc = 1
    assert CliRunner().invoke(app, ["slurm", "resume"]).exit_code == 3
    assert "kdactl:" in CliRunner().invoke(app, ["slurm", "resume", "--help"]).stdout
