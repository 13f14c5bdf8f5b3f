"""SlurmRig: a real Slurm cluster on a HostRig: slurmctld in the root namespace, one slurmd per fake host.

Debian's slurm-wlm 22.05 with munge. Everything is private to the rig: its own munged (own key and socket,
named in slurm.conf's AuthInfo), its own slurm.conf (clients find it through SLURM_CONF, see `env`), state,
spool, pid and log files under the rig's work dir, a controller port picked free on the rig's private
bridge address. Node names are the hosts' names with NodeAddr their private IPs, so nothing needs DNS.

Traps met building it (22.05 on this kind of machine):
- slurmctld refuses to run unless SlurmctldHost names this machine's own short hostname.
- `ip netns exec` mounts a fresh sysfs, so a host sees an empty /sys/fs/cgroup and slurmd's cgroup
  plugin (loaded even with proctrack/linuxproc and task/none) fails: each host gets a tmpfs there and
  cgroup.conf's CgroupAutomount mounts the v1 controllers it wants (inside the host's mount namespace).
- slurmd needs its spool dir to exist; `mpi/pmix` errors at slurmd start are harmless (MpiDefault=none).

Teardown SIGKILLs slurmd in each host (the host's PID namespace takes its job steps with it when the rig
closes), slurmctld and munged by process group, then removes the files.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from typing_extensions import Self

from .hosts import HostRig, RigHost
from .netns import RigError

SLURMD_PORT = 6818
PARTITION = "rig"


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def slurm_conf(*, cluster: str, ctl_host: str, ctl_ip: str, ctl_port: int, munge_socket: Path, work: Path,
               hosts: list[RigHost], cpus: int = 2, memory_mb: int = 4000) -> str:
    """slurm.conf text for the rig (one partition over every host, no accounting database)."""
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.priv_ip} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN" for h in hosts
    )
    return f"""\
ClusterName={cluster}
SlurmctldHost={ctl_host}({ctl_ip})
SlurmctldPort={ctl_port}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={work}/ctld
SlurmdSpoolDir={work}/spool-%n
SlurmctldPidFile={work}/slurmctld.pid
SlurmdPidFile={work}/slurmd-%n.pid
SlurmctldLogFile={work}/slurmctld.log
SlurmdLogFile={work}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdTimeout=20
InactiveLimit=0
KillWait=5
MinJobAge=600
{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmRig:
    """Context manager: slurmctld + munged here, slurmd on the first `n` hosts of `rig`, all idle."""

    def __init__(self, rig: HostRig, n: int | None = None, *, timeout_s: float = 60.0) -> None:
        for tool in ("slurmctld", "slurmd", "munged", "sinfo", "srun"):
            if shutil.which(tool) is None:
                raise RigError(f"{tool} not found: apt-get install slurmctld slurmd slurm-client munge")
        self.rig = rig
        self.hosts: list[RigHost] = rig.hosts[: n or len(rig.hosts)]
        self.work = rig.workdir / "slurm"
        self.conf_path = self.work / "slurm.conf"
        self.cluster = rig.ident
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._closed = False
        atexit.register(self.close)
        t0 = time.monotonic()
        try:
            self._start(timeout_s)
        except BaseException:
            self.close()
            raise
        self.timings["up_s"] = time.monotonic() - t0

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients (sbatch, srun, squeue, scancel, scontrol) against this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def _spawn(self, name: str, argv: list[str], host: RigHost | None = None) -> subprocess.Popen[bytes]:
        if host is not None:
            argv = ["nsenter", "--target", str(self.rig.sshd_pid(host)), "--pid", "--mount", "--uts", "--net",
                    "--", *argv]
        with open(self.work / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/",
                                    start_new_session=True, env=self.env)
        self._procs[name] = proc
        return proc

    def _start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        w = self.work
        for d in (w, w / "ctld", *(w / f"spool-{h.name}" for h in self.hosts)):
            d.mkdir(parents=True, exist_ok=True)
        key = w / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = w / "munge.sock"
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                               f"--pid-file={w}/munged.pid", f"--log-file={w}/munged.log",
                               f"--seed-file={w}/munged.seed"])
        ctl_ip = self.rig.root_priv_ip
        self.conf_path.write_text(slurm_conf(
            cluster=self.cluster, ctl_host=socket.gethostname().split(".")[0], ctl_ip=ctl_ip,
            ctl_port=_free_port(ctl_ip), munge_socket=sock, work=w, hosts=self.hosts,
        ))  # fmt: skip
        (w / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n")
        _wait(lambda: sock.exists(), deadline, "munged did not create its socket", self._procs["munged"])
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf_path)])
        for h in self.hosts:
            cgroup_tmpfs = "mountpoint -q /sys/fs/cgroup || mount -t tmpfs k3rig-cgroup /sys/fs/cgroup"
            mount = self.rig.exec(h, ["sh", "-c", cgroup_tmpfs])
            if mount.returncode != 0:
                raise RigError(f"{h.name}: mounting a tmpfs on /sys/fs/cgroup failed: {mount.stderr.strip()}")
            self.start_slurmd(h)
        _wait(lambda: set(self.node_states().values()) == {"idle"}, deadline,
              "Slurm nodes not idle", self._procs["slurmctld"], lambda: f"{self.node_states()}")

    def start_slurmd(self, host: RigHost) -> None:
        """Start (or restart) the slurmd of one host."""
        self._spawn(f"slurmd-{host.name}", ["slurmd", "-D", "-N", host.name, "-f", str(self.conf_path)], host)

    def kill_slurmd(self, host: RigHost) -> None:
        """SIGKILL one host's slurmd (its job steps run on, as on a real node whose daemon died)."""
        proc = self._procs.pop(f"slurmd-{host.name}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def node_states(self) -> dict[str, str]:
        """Node name -> state as sinfo reports it (idle, alloc, down, drain, ...)."""
        run = self.client(["sinfo", "-h", "-N", "-o", "%N %t"])
        if run.returncode != 0:
            return {}
        return {line.split()[0]: line.split()[1].rstrip("*~#$@") for line in run.stdout.splitlines() if line.strip()}

    def client(self, argv: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (from the root namespace)."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=self.env,
                              stdin=subprocess.DEVNULL)

    def log(self, name: str, lines: int = 40) -> str:
        """Tail of a daemon's log ('slurmctld', 'slurmd-h01', 'munged')."""
        path = self.work / (f"{name}.log" if name != "munged" else "munged.log")
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        """Kill slurmd, slurmctld and munged; remove the cluster's files; idempotent."""
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        problems = []
        for name in sorted(self._procs, key=lambda n: (not n.startswith("slurmd"), n != "slurmctld")):
            proc = self._procs[name]
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                problems.append(f"{name} (pid {proc.pid}) did not exit")
        for host in self.hosts:  # job steps slurmstepd left behind
            try:
                self.rig.kill_host_processes(host)
            except RigError as exc:
                problems.append(str(exc))
        shutil.rmtree(self.work, ignore_errors=True)
        atexit.unregister(self.close)
        self.timings["down_s"] = time.monotonic() - t0
        if problems:
            raise RigError("Slurm rig teardown: " + "; ".join(problems))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait(ok: Callable[[], bool], deadline: float, what: str, proc: subprocess.Popen[bytes],
          detail: Callable[[], str] = lambda: "") -> None:
    """Poll `ok` every 0.2 s until the deadline; fail fast when `proc` exits."""
    for _ in range(100_000):
        if ok():
            return
        if proc.poll() is not None:
            raise RigError(f"{what}: {proc.args[0]} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RigError(f"{what} by the deadline {detail()}".strip())
        time.sleep(0.2)
