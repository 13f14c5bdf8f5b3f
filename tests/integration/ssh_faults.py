"""What the SSH fault tests inject and how they drive a launch: a second, killable sshd on a rig host, an sshd
that accepts and never answers, SSH sessions that stall before their command, a launch in the background."""
from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import figures
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
from tests.rig import HostRig, RigHost
from tests.rig.sshd import SSHD, public_key

PORT = 2222
# A head that takes this long to load cannot be ready before a fault injected into a starting worker is seen.
SLOW_HEAD = {"K3SIM_FAULT": "slow_load:60", "K3SIM_FAULT_RANK": "0"}
# Accepts SSH connections and never answers: a node whose sshd hangs. Prints `accepted` and `closed`.
HUNG_SSHD = r"""
import socket, sys, time
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
deadline = time.monotonic() + 120
srv.settimeout(120)
conn, _ = srv.accept()
print("accepted", flush=True)
conn.settimeout(1)
while time.monotonic() < deadline:
    try:
        if not conn.recv(4096):
            break
    except socket.timeout:
        continue
    except OSError:
        break
print("closed", flush=True)
"""


class SecondSshd:
    """A second sshd on a rig host (port PORT, management address), a daemon like a real host's: unlike the
    rig's own (PID 1 of the host) it can be killed, sessions and all, while the host's other processes run on."""

    def __init__(self, rig: HostRig, host: RigHost, tmp: Path) -> None:
        self.rig, self.host = rig, host
        key = rig.workdir / host.name / "ssh_host_ed25519_key"
        own = (rig.workdir / host.name / "sshd_config").read_text().splitlines()
        self.conf, self.pidfile, self.log = tmp / "sshd2_config", tmp / "sshd2.pid", tmp / "sshd2.log"
        self.conf.write_text("\n".join([f"ListenAddress {host.mgmt_ip}:{PORT}",
                                        *(ln for ln in own if not ln.startswith(("ListenAddress", "PidFile")))]))
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(rig.known_hosts_path.read_text() + f"[{host.mgmt_ip}]:{PORT} {public_key(key)}\n")

    def start(self) -> None:
        """Start it (it daemonizes) and wait until it accepts."""
        run = self.rig.exec(self.host, [SSHD, "-f", str(self.conf), "-E", str(self.log), "-o",
                                        f"PidFile={self.pidfile}"])
        assert run.returncode == 0, run.stderr
        assert wait_for(lambda: self.pids() and _accepts(self.host.mgmt_ip), 10), self.log.read_text()

    def pids(self) -> list[int]:
        """Its master and every sshd process under it (one pair per open connection), as the host sees them."""
        try:
            master = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return []
        rows = [line.split(None, 2) for line in self.rig.exec(self.host, ["ps", "-eo", "pid=,ppid=,args="]).stdout
                .splitlines()]
        found, todo = [], [master]
        while todo:
            pid = todo.pop()
            if any(int(r[0]) == pid and r[2].startswith(("sshd", SSHD)) for r in rows):
                found.append(pid)
                todo += [int(r[0]) for r in rows if int(r[1]) == pid]
        return found

    def kill(self) -> None:
        """SIGKILL the daemon and its sessions: open connections drop, new ones are refused."""
        pids = self.pids()
        if pids:
            self.rig.exec(self.host, ["kill", "-KILL", *map(str, pids)])
        assert wait_for(lambda: not self.pids() and not _accepts(self.host.mgmt_ip), 10), self.pids()
        self.pidfile.unlink(missing_ok=True)


def _accepts(ip: str) -> bool:
    import socket

    try:
        with socket.create_connection((ip, PORT), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def launching(topo: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`k3deploy launch TOPO ARGS` in the background (stderr carries its progress lines); killed if it is
    still running when the block ends."""
    proc = start_k3deploy("launch", topo, "--skip-preflight", *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def after(fault: Callable[[], object], proc: subprocess.Popen[str], timeout_s: float) -> tuple[int, str, float]:
    """Inject `fault` (counted in the figures) into a running launch, which must then end within timeout_s:
    its exit code, its stderr and the seconds it took to end."""
    fault()
    figures.fault_injected()
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, err, time.monotonic() - t0


def nodes_via(rig: HostRig, rank: int, port: int) -> list[dict[str, object]]:
    """The default nodes, one of them reached on another SSH port."""
    nodes: list[dict[str, object]] = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig.hosts]
    nodes[rank]["ssh"] = {"port": port}
    return nodes



def next_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The next stdout line of `proc`, or '' after timeout_s."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""



class StalledSessions:
    """Every new SSH session on one host waits in root's ~/.ssh/rc (sshd runs it before the session's command)
    while a gate file exists, as sessions do behind a hung NFS home or a slow PAM module (bounded: 60 s). The
    rc is bind-mounted in that host's own mount namespace only."""

    def __init__(self, rig: HostRig, host: RigHost, tmp: Path) -> None:
        self.rig, self.host = rig, host
        self.dot_ssh = Path(os.path.expanduser("~root")) / ".ssh"
        self.folder, self.gate, self.waiting = tmp / f"dot-ssh-{host.name}", tmp / "gate", tmp / "waiting"
        self.folder.mkdir()
        (self.folder / "rc").write_text(f"echo $$ > {self.waiting}\ni=0\n"
                                        f"while [ -e {self.gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n")
        self.made_dot_ssh = False

    def arm(self) -> None:
        """Close the gate and put the rc in place on the host."""
        self.gate.touch()
        if not self.dot_ssh.exists():  # a fresh machine: the mount point must exist
            self.dot_ssh.mkdir(mode=0o700)
            self.made_dot_ssh = True
        done = self.rig.exec(self.host, ["mount", "--bind", str(self.folder), str(self.dot_ssh)])
        assert done.returncode == 0, done.stderr

    def release(self) -> None:
        """Open the gate: every waiting session goes on to run its command."""
        self.gate.unlink(missing_ok=True)

    def disarm(self) -> None:
        """Open the gate and take the rc away."""
        self.release()
        self.rig.exec(self.host, ["umount", str(self.dot_ssh)])
        if self.made_dot_ssh:
            self.dot_ssh.rmdir()


@contextmanager
def stalled_sessions(rig: HostRig, host: RigHost, tmp: Path) -> Iterator[StalledSessions]:
    """New SSH sessions on `host` stall until released (or the block ends)."""
    stall = StalledSessions(rig, host, tmp)
    stall.arm()
    try:
        yield stall
    finally:
        stall.disarm()
