"""A real Slurm cluster on localhost for tests: munged, slurmctld and one slurmd per node, from
Debian's packages.

``python -m tests.slurm.cluster [NODES]`` starts one and waits (Ctrl-C stops it); tests use
:func:`running_cluster`. Everything lives in a scratch directory: slurm.conf, state,
logs and pid files. The daemons are stopped by the pids they wrote, never by name.
Needs root (slurmd runs jobs as their users) and the packages ``munge slurmctld
slurmd slurm-client``; :func:`unavailable` says why a machine cannot run one.

Several nodes on one host: a slurmd per node, started as that node (``slurmd -N <name>``),
each with its own ``Port`` and its own spool, pid and log files (``%n`` in slurm.conf). That
needs a Slurm built with ``--enable-multiple-slurmd``, which Debian's is (``scontrol show
config``: ``MULTIPLE_SLURMD = Yes``). The nodes' names are names that resolve here, the host's
own and ``localhost``: Lightning's ``SLURMEnvironment`` makes the first node of a job's
``SLURM_NODELIST`` the rendezvous address, as on a real cluster.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager, suppress
from pathlib import Path

#: CPUs each node declares (more than this machine may have: SlurmdParameters=config_overrides).
CPUS = 8

SLURM_CONF = """\
ClusterName=tuneup-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket},cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
# A requeued job may start cred_expire seconds after its requeue (below); then only a periodic
# pass starts it: the backfill pass, every 30 s by default, every second here.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
MinJobAge=3600
KillWait=5
ReturnToService=2
# cred_expire (AuthInfo) is also how long a requeued job waits before it may start: 120 s by
# default, 5 s the least Slurm accepts (a smaller value is replaced by the default).
SlurmdParameters=config_overrides
{node_lines}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""
#: A node: all on this host, each slurmd on its own port.
NODE = (
    "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
    "RealMemory=2000 State=UNKNOWN"
)

#: submitit asks sacct for job states; without slurmdbd it fails. This stand-in answers from
#: scontrol, in the "JobID|State" form submitit parses.
SACCT = r"""#!/bin/sh
echo "JobID|State|NodeList"
scontrol -o show job 2>/dev/null | sed -n \
  -e 's/^JobId=[0-9]* ArrayJobId=\([0-9]*\) ArrayTaskId=\([0-9]*\) .* JobState=\([A-Z_]*\) .*/\1_\2|\3|localhost/p' \
  -e 's/^JobId=\([0-9]*\) .* JobState=\([A-Z_]*\) .*/\1|\2|localhost/p'
"""


def unavailable() -> str | None:
    """Why this machine cannot run the test cluster, or None when it can."""
    if os.geteuid() != 0:
        return "not root: slurmd must run as root to start jobs as their users"
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch") if not _which(b)]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found): apt-get install munge slurmctld slurmd slurm-client"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d, name)).exists()), None
    )


def node_names(count: int) -> list[str]:
    """``count`` node names that resolve on this host (to it): its own name, then localhost."""
    names = list(dict.fromkeys([socket.gethostname().split(".")[0], "localhost"]))
    if count > len(names):
        raise ValueError(f"{count} nodes: only {len(names)} names resolve here ({names})")
    return names[:count]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path, nodes: int = 1) -> None:
        self.root = root
        self.nodes = node_names(nodes)
        self.pids: dict[str, int] = {}
        self.env = dict(os.environ)

    def start(self) -> None:
        root = self.root
        for sub in ("state", "bin", *(f"spool-{name}" for name in self.nodes)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        munge_dir = root / "munge"
        munge_dir.mkdir(mode=0o700, exist_ok=True)
        shutil.chown(munge_dir, "munge", "munge")
        socket_path = munge_dir / "munge.socket.2"
        subprocess.run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                _which("munged"),
                "-S",
                str(socket_path),
                f"--pid-file={munge_dir}/munged.pid",
                f"--log-file={munge_dir}/munged.log",
                f"--seed-file={munge_dir}/munged.seed",
                "--force",
            ],
            check=True,
        )
        self.pids["munged"] = int(_wait_for_file(munge_dir / "munged.pid").read_text())
        host = socket.gethostname().split(".")[0]
        conf = root / "slurm.conf"
        nodes = [NODE.format(name=n, host=host, port=_free_port(), cpus=CPUS) for n in self.nodes]
        conf.write_text(
            SLURM_CONF.format(
                host=host,
                root=root,
                munge_socket=socket_path,
                ctld_port=_free_port(),
                node_lines="\n".join(nodes),
                node_names=",".join(self.nodes),
            )
        )
        sacct = root / "bin" / "sacct"
        sacct.write_text(SACCT)
        sacct.chmod(0o755)
        self.env.update(SLURM_CONF=str(conf), PATH=f"{root / 'bin'}:{os.environ['PATH']}")
        subprocess.run([_which("slurmctld"), "-i"], check=True, env=self.env)
        self.pids["slurmctld"] = int(_wait_for_file(root / "slurmctld.pid").read_text())
        if len(self.nodes) > 1 and not self.multiple_slurmd():
            raise RuntimeError(
                "this Slurm runs one slurmd per host (built without "
                "--enable-multiple-slurmd): no test cluster of several nodes"
            )
        for name in self.nodes:
            subprocess.run([_which("slurmd"), "-N", name], check=True, env=self.env)
            self.pids[f"slurmd-{name}"] = int(
                _wait_for_file(root / f"slurmd-{name}.pid").read_text()
            )
        self.wait_idle()

    def multiple_slurmd(self) -> bool:
        """Whether this Slurm's build runs several slurmd on one host (as several nodes)."""
        config = self.run("scontrol", "show", "config", check=False).stdout
        return any(line.split() == ["MULTIPLE_SLURMD", "=", "Yes"] for line in config.splitlines())

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%t", check=False).stdout.strip()
            if state == "idle":  # one line: every node idle
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"the test Slurm nodes are not idle after {timeout} s: {state!r}\n" + self.logs()
        )

    def end_jobs(self, timeout: float = 30) -> None:
        import getpass

        self.run("scancel", "--user", getpass.getuser(), check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.run("squeue", "-h", "-t", "PD,R,CG,S", check=False).stdout.strip()
            if not left:
                return
            time.sleep(0.1)

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, check=check)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log"))
        )

    def stop(self) -> None:
        if "slurmctld" in self.pids:  # jobs left (a trial the search no longer waits for) end
            self.end_jobs()  # while slurmd can still end their steps, or srun waits forever
        for name in (*(f"slurmd-{n}" for n in self.nodes), "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


def _wait_for_file(path: Path, timeout: float = 20) -> Path:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)
    return path


@contextmanager
def running_cluster(nodes: int = 1):
    """A started cluster of ``nodes`` nodes (its ``env`` has SLURM_CONF and PATH for the
    clients); stopped after.

    Its scratch directory is a fresh one under the system temp dir, readable by the
    munge user (pytest's tmp_path is root-only), and removed afterwards.
    """
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="tuneup-slurm-"))
    root.chmod(0o755)
    cluster = Cluster(root, nodes)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    import sys

    with running_cluster(int(sys.argv[1]) if len(sys.argv) > 1 else 1) as c:
        print(f"Slurm running: export SLURM_CONF={c.env['SLURM_CONF']}; Ctrl-C stops it")
        with suppress(KeyboardInterrupt):
            signal.pause()
