"""The rest of the SSH fault matrix on the namespace rig, each fault injected into a running `k3deploy launch`
(or deployment): one node's sshd killed while it starts, one host's private link cut while it starts and
after ready, Ctrl-C while an SSH connection hangs, while a start hangs in its session (head starting, workers
starting) and while waiting for ready, the head killed after ready, the readiness deadline passing, the
supervisor killed. Each ends with the failing node
(or the interrupt) and cause named, the documented exit code, and no process of the deployment left on any
host."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from k3deploy.launch.state import StateStore
from tests import figures
from tests.integration.test_launch_ssh import (
    Deployments,
    deployments,
    engine_running,
    hosts_empty,
)
from tests.k3deploy_cli import run_k3deploy as cli
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
from tests.rig import HostRig, RigHost
from tests.rig.sshd import SSHD, public_key
from tests.unit.test_launch_support import assert_supervisor_stopped_group

pytestmark = pytest.mark.integration
__all__ = ["deployments"]  # fixtures

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


@pytest.fixture
def sshd2(rig4: HostRig, tmp_path: Path) -> Iterator[SecondSshd]:
    """A second, killable sshd on h03 (rank 2 of the deployments here); gone after the test."""
    d = SecondSshd(rig4, rig4.hosts[2], tmp_path)
    d.start()
    yield d
    d.kill()


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


@pytest.mark.timeout(150)
def test_sshd_killed_on_a_starting_worker_stops_the_rest_and_says_what_is_left(
        deployments: Deployments, rig4: HostRig, sshd2: SecondSshd, capsys: pytest.CaptureFixture[str]) -> None:
    """sshd dies (its sessions too) on rank 2 while the group starts: launch loses that node, stops the three
    it still reaches, names rank 2 and says it could not be stopped; once sshd is back, `stop` finishes it."""
    victim = rig4.hosts[2]
    # rank 2 never joins the group, so stopping its peers cannot end it (a joined stand-in worker exits at
    # once when its Gloo neighbours go, which CI saw): its engine runs on only because nobody can reach it.
    hang = {"K3SIM_FAULT": "hang_at_rendezvous:900", "K3SIM_FAULT_RANK": "2"}
    topo = deployments.topology("it-sshd-kill", nodes=nodes_via(rig4, 2, PORT), env=hang,
                                launch={"dist_timeout_s": 120, "ready_timeout_s": 130})
    with launching(topo, "--known-hosts", str(sshd2.known_hosts)) as proc:
        assert wait_for(lambda: engine_running(rig4, victim.name), 60), proc.poll()
        assert StateStore(deployments.state_dir).require("it-sshd-kill").status == "starting"
        code, err, took = after(sshd2.kill, proc, 60)
    assert code == 4, err
    who = f"rank 2 ({victim.mgmt_ip})"
    assert f"error: {who}: unreachable: " in err and f"cannot connect to root@{victim.mgmt_ip}:{PORT}" in err, err
    assert "connection refused" in err and "Traceback" not in err
    assert f"every node was stopped except {who}, which could not be reached" in err, err
    assert f"hint: {who} may still run; once reachable again: k3deploy stop it-sshd-kill" in err, err
    others = [h for h in rig4.hosts if h is not victim]
    assert wait_for(lambda: not any(rig4.pids(h) for h in others), 10), {h.name: rig4.pids(h) for h in others}
    assert engine_running(rig4, victim.name)  # out of reach: it runs on, as the message says
    status = deployments.failed_status(topo, "it-sshd-kill", 2, victim.mgmt_ip)
    rec = StateStore(deployments.state_dir).require("it-sshd-kill")
    assert [n.phase for n in rec.nodes] == ["stopped", "stopped", "unknown", "stopped"], rec.nodes
    # `status` asks the node it could not stop again: still out of reach, it may still run.
    assert [(n["phase"], n["alive"]) for n in status["nodes"]] == [
        ("stopped", False), ("stopped", False), ("unknown", None), ("stopped", False)], status["nodes"]
    wide = {**os.environ, "COLUMNS": "200"}
    assert f"{who} could not be stopped and may still run: k3deploy stop it-sshd-kill" in \
        cli("status", str(topo), env=wide).stdout

    with capsys.disabled():
        print(f"\nsshd killed on a starting worker: launch exited 4 {took:.1f} s later, 3 of 4 nodes stopped")
    sshd2.start()  # the host's admin brings sshd back
    back = json.loads(cli("status", str(topo), "--json").stdout)
    assert back["nodes"][2]["alive"] is True, back["nodes"]  # reachable again: it does still run
    assert f"{who} still runs: k3deploy stop it-sshd-kill" in cli("status", str(topo), env=wide).stdout
    stop = cli("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    sshd2.kill()
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}


@pytest.mark.timeout(120)
def test_private_link_cut_on_a_starting_worker_names_that_node(deployments: Deployments, rig4: HostRig,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """rank 2's private link goes down while the group forms: whichever node's rendezvous times out first,
    the failure names rank 2 and its interface, and every node is stopped (SSH uses the management link)."""
    victim = rig4.hosts[2]
    topo = deployments.topology("it-link-start")
    try:
        with launching(topo) as proc:
            assert wait_for(lambda: engine_running(rig4, victim.name), 60), proc.poll()
            code, err, took = after(lambda: rig4.set_link(victim, victim.priv_iface, up=False), proc, 90)
    finally:
        rig4.set_link(victim, victim.priv_iface, up=True)
    assert code == 4, err
    assert f"error: rank 2 ({victim.mgmt_ip}): its private interface {victim.priv_iface} is down" in err, err
    assert "every node was stopped" in err and "Traceback" not in err
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    rec = StateStore(deployments.state_dir).require("it-link-start")
    assert rec.status == "failed" and rec.failure is not None and rec.failure.rank == 2
    assert rec.owner is None
    with capsys.disabled():
        print(f"\nprivate link cut on a starting worker: launch exited 4 {took:.1f} s later: "
              f"{rec.failure.cause[:160]}")


@pytest.mark.timeout(150)
def test_private_link_cut_after_ready_supervisor_names_that_node(deployments: Deployments, rig4: HostRig,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """rank 2's private link goes down under a ready deployment: the group's heartbeats break, the supervisor
    stops every node and `status` names rank 2 and its interface."""
    victim = rig4.hosts[2]
    topo = deployments.topology("it-link-ready")
    run = cli("launch", str(topo), "--skip-preflight")
    assert run.returncode == 0, run.stderr
    supervisor = StateStore(deployments.state_dir).require("it-link-ready").owner
    assert supervisor is not None and supervisor.alive()
    rig4.set_link(victim, victim.priv_iface, up=False)
    figures.fault_injected()
    t0 = time.monotonic()
    try:
        status = deployments.failed_status(topo, "it-link-ready", 2, victim.mgmt_ip) if wait_for(
            lambda: StateStore(deployments.state_dir).require("it-link-ready").status == "failed", 60, 0.5) else {}
    finally:
        rig4.set_link(victim, victim.priv_iface, up=True)
    assert status, (deployments.state_dir / "it-link-ready.supervisor.log").read_text()
    assert status["failure"]["cause"].startswith(f"its private interface {victim.priv_iface} is down"), status
    assert hosts_empty(rig4) and wait_for(lambda: not supervisor.alive(), 5)
    with capsys.disabled():
        print(f"\nprivate link cut after ready: every node stopped within {time.monotonic() - t0:.1f} s: "
              f"{status['failure']['cause'][:160]}")


def _line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The next stdout line of `proc`, or '' after timeout_s."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""


@pytest.mark.timeout(90)
def test_ctrl_c_while_an_ssh_connection_hangs_exits_130_at_once(deployments: Deployments, rig4: HostRig) -> None:
    """rank 3's sshd accepts the connection and never answers (a 30 s connect timeout): Ctrl-C while launch
    waits on it ends the launch at once with 130, the hanging connection closed and nothing started."""
    host = rig4.hosts[3]
    hung = subprocess.Popen(["nsenter", "--target", str(rig4.sshd_pid(host)), "--net", "--", sys.executable, "-c",
                             HUNG_SSHD, host.mgmt_ip, str(PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert _line(hung, 10) == "listening"
        topo = deployments.topology("it-ctrl-c-connect", nodes=nodes_via(rig4, 3, PORT))
        with launching(topo, "--connect-timeout", "30") as proc:
            assert _line(hung, 30) == "accepted"  # launch is in its SSH handshake with rank 3
            code, err, took = after(lambda: proc.send_signal(signal.SIGINT), proc, 20)
        assert code == 130, err
        assert "interrupted" in err and "Traceback" not in err
        assert took < 45, took  # not the 3 x 30 s of connect attempts
        assert _line(hung, 10) == "closed"  # the hanging connection was given up, not left open
    finally:
        hung.kill()
        hung.wait(timeout=10)
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    rec = StateStore(deployments.state_dir).require("it-ctrl-c-connect")
    assert rec.status == "stopped" and rec.owner is None and all(n.handle is None for n in rec.nodes)
    assert rec.failure is not None and rec.failure.cause.startswith("interrupted")
    assert json.loads(cli("status", str(topo), "--json").stdout)["status"] == "stopped"


@pytest.mark.timeout(90)
def test_ctrl_c_while_waiting_for_ready_stops_every_node_over_ssh(deployments: Deployments, rig4: HostRig) -> None:
    """Every engine runs, rank 0 still loading: Ctrl-C stops all four over SSH and exits 130."""
    topo = deployments.topology("it-ctrl-c-ready", env=SLOW_HEAD, launch={"dist_timeout_s": 60, "ready_timeout_s": 90})
    with launching(topo) as proc:
        assert wait_for(lambda: all(engine_running(rig4, h.name) for h in rig4.hosts), 60), proc.poll()
        code, err, _ = after(lambda: proc.send_signal(signal.SIGINT), proc, 30)
    assert code == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    rec = StateStore(deployments.state_dir).require("it-ctrl-c-ready")
    assert rec.status == "stopped" and rec.owner is None and [n.phase for n in rec.nodes] == ["stopped"] * 4
    assert rec.failure is not None and rec.failure.cause.startswith("interrupted")


@pytest.mark.timeout(120)
def test_head_killed_after_ready_stops_the_workers_and_names_it(deployments: Deployments, rig4: HostRig) -> None:
    """Rank 0 (the head, the rendezvous store's host) dies after ready: the supervisor stops the workers and the
    record names rank 0. The workers outlive their head (outlive_head), as real vLLM's headless node does
    (tests/realengine/test_health_peer_gone.py): only supervision can have stopped them."""
    topo = deployments.topology("it-kill-head", env={"K3SIM_FAULT": "outlive_head"})
    run = cli("launch", str(topo))
    assert run.returncode == 0, run.stderr
    supervisor = StateStore(deployments.state_dir).require("it-kill-head").owner
    assert supervisor is not None and supervisor.alive()
    head = rig4.hosts[0]
    rig4.kill_host_processes(head)
    figures.fault_injected()
    workers = rig4.hosts[1:]
    assert wait_for(lambda: not any(engine_running(rig4, h.name) for h in workers), 30), \
        {h.name: rig4.pids(h) for h in workers}
    deployments.failed_status(topo, "it-kill-head", 0, head.mgmt_ip)
    assert hosts_empty(rig4) and wait_for(lambda: not supervisor.alive(), 5)
    assert_supervisor_stopped_group(deployments.state_dir / "it-kill-head.supervisor.log", 0, [1, 2, 3])
    for rank in (1, 2, 3):  # none noticed its head: the fault held them up
        assert "Lost the head node" not in (deployments.tmp / "logs" / f"it-kill-head-rank{rank}.log").read_text()


@pytest.mark.timeout(120)
def test_readiness_deadline_passing_stops_every_node(deployments: Deployments, rig4: HostRig) -> None:
    """Every engine starts, rank 0 loads for a minute: at launch.ready_timeout_s launch gives up, says so with the
    setting's name, stops all four nodes over SSH and exits 4."""
    topo = deployments.topology("it-deadline", env=SLOW_HEAD, launch={"dist_timeout_s": 60, "ready_timeout_s": 8})
    figures.fault_injected()
    run = cli("launch", str(topo))
    assert run.returncode == 4, run.stdout + run.stderr
    assert "not ready after 8 s (launch.ready_timeout_s)" in run.stderr, run.stderr
    assert "every node was stopped" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    rec = StateStore(deployments.state_dir).require("it-deadline")
    assert rec.status == "failed" and rec.owner is None and [n.phase for n in rec.nodes] == ["stopped"] * 4


@pytest.mark.timeout(120)
def test_supervisor_killed_status_says_so_and_stop_still_stops_everything(deployments: Deployments,
                                                                          rig4: HostRig) -> None:
    """The supervisor dies (the OOM killer on the launch machine): the engines run on unwatched, `status` says
    nothing would stop them, and `stop` still stops all four over SSH."""
    topo = deployments.topology("it-kill-supervisor")
    run = cli("launch", str(topo))
    assert run.returncode == 0, run.stderr
    supervisor = StateStore(deployments.state_dir).require("it-kill-supervisor").owner
    assert supervisor is not None and supervisor.role == "supervisor"
    os.kill(supervisor.pid, signal.SIGKILL)
    figures.fault_injected()
    assert wait_for(lambda: not supervisor.alive(), 10)
    status = json.loads(cli("status", str(topo), "--json").stdout)
    assert status["supervised"] is False and [n["alive"] for n in status["nodes"]] == [True] * 4, status
    human = cli("status", str(topo), env={**os.environ, "COLUMNS": "200"})
    assert "none running: nothing stops the other nodes if one dies" in human.stdout, human.stdout
    stop = cli("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert json.loads(cli("status", str(topo), "--json").stdout)["status"] == "stopped"


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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rank", [0, 2], ids=["head-starting", "workers-starting"])
def test_ctrl_c_while_a_start_hangs_in_its_session_starts_nothing_later(deployments: Deployments, rig4: HostRig,
                                                                        tmp_path: Path, rank: int) -> None:
    """A node's start command hangs before it runs (its SSH session stalls in ~/.ssh/rc): rank 0's (head
    starting), or rank 2's while the other workers start. Ctrl-C exits 130 and stops what started; when the
    stalled session later goes on to run the start launch gave up on, that must start nothing."""
    host = rig4.hosts[rank]
    name = f"it-ctrl-c-start{rank}"
    topo = deployments.topology(name)
    with stalled_sessions(rig4, host, tmp_path) as stall:
        with launching(topo) as proc:
            assert wait_for(stall.waiting.exists, 60), proc.poll()  # the start is stuck in its session
            others = [h for h in rig4.hosts if h is not host] if rank else []  # the head starts before any worker
            assert wait_for(lambda: all(engine_running(rig4, h.name) for h in others), 30), proc.poll()
            code, err, took = after(lambda: proc.send_signal(signal.SIGINT), proc, 30)
        assert code == 130, err
        assert "interrupted" in err and "Traceback" not in err, err
        assert took < 18, took  # not the 20 s control timeout of the stalled start
        stall.release()  # the session goes on: sshd now runs the start command
        # Every host empties, the stalled session included; an engine it started would stay and fail this.
        assert hosts_empty(rig4, 15), {h.name: rig4.pids(h) for h in rig4.hosts}
    rec = StateStore(deployments.state_dir).require(name)
    assert rec.status == "stopped" and rec.owner is None, rec
