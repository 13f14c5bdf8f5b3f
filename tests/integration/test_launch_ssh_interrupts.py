"""Ctrl-C in every phase of a `k3deploy launch` over SSH on the namespace rig: while an SSH connection hangs,
while a start hangs in its session (head starting, workers starting) and while waiting for ready. Each exits
130 (`interrupted`) at once and leaves no process of the deployment on any host, even when a stalled start
goes on after launch gave up."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from k3deploy.records.store import StateStore
from tests.integration.sim_deployments import Deployments, engine_running, hosts_empty
from tests.integration.ssh_faults import (
    HUNG_SSHD,
    PORT,
    SLOW_HEAD,
    after,
    launching,
    next_line,
    nodes_via,
    stalled_sessions,
)
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig

pytestmark = pytest.mark.integration


@pytest.mark.timeout(90)
def test_ctrl_c_while_an_ssh_connection_hangs_exits_130_at_once(deployments: Deployments, rig4: HostRig) -> None:
    """rank 3's sshd accepts the connection and never answers (a 30 s connect timeout): Ctrl-C while launch
    waits on it ends the launch at once with 130, the hanging connection closed and nothing started."""
    host = rig4.hosts[3]
    hung = subprocess.Popen(["nsenter", "--target", str(rig4.sshd_pid(host)), "--net", "--", sys.executable, "-c",
                             HUNG_SSHD, host.mgmt_ip, str(PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert next_line(hung, 10) == "listening"
        topo = deployments.topology("it-ctrl-c-connect", nodes=nodes_via(rig4, 3, PORT))
        with launching(topo, "--connect-timeout", "30") as proc:
            assert next_line(hung, 30) == "accepted"  # launch is in its SSH handshake with rank 3
            code, err, took = after(lambda: proc.send_signal(signal.SIGINT), proc, 20)
        assert code == 130, err
        assert "interrupted" in err and "Traceback" not in err
        assert took < 45, took  # not the 3 x 30 s of connect attempts
        assert next_line(hung, 10) == "closed"  # the hanging connection was given up, not left open
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
