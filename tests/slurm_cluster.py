"""A real single-host Slurm for the integration test: munged, slurmctld and slurmd started here on
localhost with a private slurm.conf, munge key and ports, stopped again by the fixture's finalizer."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo")


def _bin(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def missing() -> str | None:
    """Why the cluster cannot start here, or None."""
    absent = [d for d in DAEMONS if _bin(d) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the private Slurm runs its daemons as SlurmUser=root: needs root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _select_type() -> str:
    libdirs = [Path(p) for p in ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib/slurm")]
    have = {p.stem for d in libdirs if d.is_dir() for p in d.glob("select_*.so")}
    return "select/linear" if "select_linear" in have or not have else "select/cons_tres"


@dataclass
class SlurmCluster:
    root: Path
    node: str
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30)

    def show(self) -> tuple[str, str]:
        """(State, Reason) of the node, the reason without Slurm's [user@time] suffix."""
        from kdactl.integrations.slurm import SubprocessRunner, show_node

        s = show_node(SubprocessRunner(env=self.env), self.node)
        return s.state, s.reason

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)


def _conf(root: Path, node: str, sock: Path) -> str:
    return f"""ClusterName=kdactltest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType={_select_type()}
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={node} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def start(timeout_s: float = 60.0) -> SlurmCluster:
    root = Path(tempfile.mkdtemp(prefix="kdactl-slurm-"))  # short: munge's socket path must fit sun_path
    for d in ("munge", "state", "spool"):
        (root / d).mkdir(mode=0o700)
    os.chmod(root, 0o755)  # munged wants the socket's directory reachable
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = root / "munge" / "munge.sock"
    node = socket.gethostname().split(".")[0]
    (root / "slurm.conf").write_text(_conf(root, node, sock))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = SlurmCluster(root, node, env)

    def spawn(argv: list[str], log: str) -> None:
        out = open(root / log, "ab")
        cluster.procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    try:
        spawn([_bin("munged"), "-F", "-f", f"--key-file={key}", f"--socket={sock}", f"--pid-file={root}/munge/munged.pid",
               f"--log-file={root}/munged.log", f"--seed-file={root}/munge/seed"], "munged.out.log")  # fmt: skip
        _wait(lambda: sock.exists(), 15, "munged socket", cluster)
        spawn([_bin("slurmctld"), "-D", "-c", "-f", str(root / "slurm.conf")], "slurmctld.out.log")
        spawn([_bin("slurmd"), "-D", "-f", str(root / "slurm.conf")], "slurmd.out.log")
        _wait(lambda: _idle(cluster), timeout_s, f"node {node} idle in sinfo", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _idle(cluster: SlurmCluster) -> bool:
    p = subprocess.run(["sinfo", "-h", "-n", cluster.node, "-o", "%T"], env=cluster.env, capture_output=True, text=True, timeout=10)
    return p.returncode == 0 and p.stdout.strip() == "idle"


def _wait(cond, timeout_s: float, what: str, cluster: SlurmCluster) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        dead = [p.args[0] for p in cluster.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}\n{cluster.logs()}")
        try:
            if cond():
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}\n{cluster.logs()}")
