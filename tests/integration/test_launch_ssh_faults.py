"""The SSH fault matrix on the namespace rig, each fault injected into a running `k3deploy launch` (or
deployment): one node's sshd killed while it starts, one host's private link cut while it starts and after
ready, the head killed after ready, the readiness deadline passing, the supervisor killed (Ctrl-C in each
phase: test_launch_ssh_interrupts.py). Each ends with the failing node and cause named, the documented exit
code, and no process of the deployment left on any host."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from k3deploy.records.store import StateStore
from tests import figures
from tests.integration.sim_deployments import Deployments, engine_running, hosts_empty
from tests.integration.ssh_faults import (
    PORT,
    SLOW_HEAD,
    SecondSshd,
    after,
    launching,
    nodes_via,
)
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig
from tests.unit.test_launch_support import assert_supervisor_stopped_group

pytestmark = pytest.mark.integration


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



@pytest.mark.timeout(120)
def test_head_killed_after_ready_stops_the_workers_and_names_it(deployments: Deployments, rig4: HostRig) -> None:
    """Rank 0 (the head, the rendezvous store's host) dies after ready: the supervisor stops the workers and the
    record names rank 0. The workers outlive their head (outlive_head), as real vLLM's headless node does
    (tests/realengine/test_health_peer_gone.py): only supervision can have stopped them."""
    topo = deployments.topology("it-kill-head", env={"K3SIM_FAULT": "outlive_head"})
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
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
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
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
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
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
