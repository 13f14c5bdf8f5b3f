"""`k3deploy launch` over SSH to four network-namespace hosts running the real stand-in engine:
ready/status/logs/stop leave nothing behind (hostile topology strings never execute), through a jump host
too; a worker killed during start-up or after ready stops every node within seconds and names it; a control
network outage is not a node failure (refused before anything starts: test_launch_ssh_refused.py)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3deploy.records.store import StateStore
from tests import figures
from tests.integration.sim_deployments import GLOO, Deployments, engine_running, hosts_empty
from tests.k3deploy_cli import run_k3deploy as cli
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
from tests.rig import HostRig, RigHost
from tests.unit.test_launch_support import assert_supervisor_stopped_group

pytestmark = pytest.mark.integration

@pytest.mark.timeout(150)
def test_launch_ready_status_logs_stop_leave_nothing(deployments: Deployments, rig4: HostRig,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    marker = deployments.tmp / "pwned"
    hostile = f"$(touch {marker}); `touch {marker}`; touch {marker} #'\""
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    nodes[1] = {"host": "h02", "ip": rig4.hosts[1].priv_ip, "iface": "ens-priv"}  # via the ssh config alias
    topo = deployments.topology("it-e2e", nodes=nodes, env={"K3_NOTE": hostile, **GLOO},
                                launch={"log_dir": str(deployments.tmp / f"logs {hostile}")})
    t0 = time.monotonic()
    run = cli("launch", str(topo), "--ssh-config", str(rig4.ssh_config_path), "--json")
    launch_s = time.monotonic() - t0
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)
    assert rec["status"] == "ready" and rec["owner"]["role"] == "supervisor"
    assert rec["preflight"] == "passed"  # the launch's own preflight over SSH (the other launches here skip it)
    attempt = rec["attempts"][0]
    with capsys.disabled():
        print(f"\n4 SSH hosts: launch to ready {attempt['ready_at'] - attempt['started_at']:.1f} s "
              f"(CLI wall {launch_s:.1f} s)")
    for host in rig4.hosts:
        assert engine_running(rig4, host.name)

    st = cli("status", str(topo), "--json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["status"] == "ready" and status["ready"] is True and status["supervised"] is True
    assert [n["alive"] for n in status["nodes"]] == [True] * 4
    assert [n["host"] for n in status["nodes"]][1] == "h02"

    logs = cli("logs", str(topo), "--node", "0", "--node", "2", "--lines", "200")
    assert logs.returncode == 0, logs.stderr
    prefixes = {line.split("]")[0] + "]" for line in logs.stdout.splitlines()}
    assert prefixes == {f"[0 {rig4.hosts[0].mgmt_ip}]", f"[2 {rig4.hosts[2].mgmt_ip}]"}
    assert "The server is fired up and ready to roll!" in logs.stdout
    assert "k3sim: torch.distributed gloo group up" in logs.stdout  # real Gloo across the hosts

    t0 = time.monotonic()
    stop = cli("stop", str(topo))
    stop_s = time.monotonic() - t0
    assert stop.returncode == 0, stop.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert json.loads(cli("status", str(topo), "--json").stdout)["status"] == "stopped"
    assert cli("stop", str(topo)).returncode == 0  # idempotent
    assert not marker.exists()  # the hostile env value and log_dir were data on every host
    assert (deployments.tmp / f"logs {hostile}" / "it-e2e-rank3.log").exists()
    assert re.search(r"export K3_NOTE='\$\(touch ", Path(rec["jobs"][0]["command"]).as_posix())
    with capsys.disabled():
        print(f"stop over SSH: {stop_s:.1f} s")


@pytest.mark.timeout(150)
def test_launch_from_a_login_node_through_a_jump_host_checks_readiness_on_rank_0(deployments: Deployments,
                                                                                   rig4: HostRig) -> None:
    """k3deploy on a login node that reaches only h01's management address: SSH goes through h01 (the jump
    host) to every node's private address, and rank 0's URL (a private address too) is asked on rank 0."""
    ctl = rig4.controller()

    def ctl_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, prefix=("ip", "netns", "exec", ctl))

    bastion = rig4.hosts[0]
    nodes = [{"host": h.priv_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    topo = deployments.topology("it-bastion", nodes=nodes)
    url = f"http://{rig4.hosts[0].priv_ip}:18000"
    code = "import sys; from k3deploy.serving.readiness import reachable_from_here as r; print(r(sys.argv[1]))"
    probe = subprocess.run(["ip", "netns", "exec", ctl, sys.executable, "-c", code, url], capture_output=True,
                           text=True, timeout=60, check=False)
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr  # the nodes really are out of reach

    direct = ctl_cli("launch", str(topo), "--ssh-jump", "none")
    assert direct.returncode == 3 and f"cannot connect to root@{nodes[0]['host']}:22" in direct.stderr, direct.stderr
    assert "Network is unreachable" in direct.stderr or "timed out" in direct.stderr, direct.stderr

    # The rig is shared by the run: only what the sshd logs from here on is this launch's (the login-route
    # validate tests connect through the same bastion from the same controller).
    marks = {h.name: len(rig4.sshd_log(h, 10**6).splitlines()) for h in rig4.hosts}

    def sshd_log_since(host: RigHost) -> str:
        return "\n".join(rig4.sshd_log(host, 10**6).splitlines()[marks[host.name]:])

    run = ctl_cli("launch", str(topo), "--ssh-jump", f"root@{bastion.mgmt_ip}", "--json")
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)
    assert rec["status"] == "ready" and rec["probe_from"] == "head" and rec["url"] == url
    assert {j["target"]["jump"] for j in rec["jobs"]} == {f"root@{bastion.mgmt_ip}"}
    for host in rig4.hosts[1:]:  # each node's sshd saw the connection come from the jump host
        assert f"Accepted publickey for root from {bastion.priv_ip}" in sshd_log_since(host), host.name
    # One connection to the bastion per process, shared by all four nodes: launch's, and its supervisor's
    # once that has started (unshared, launch alone would have made four).
    assert sshd_log_since(bastion).count(f"Accepted publickey for root from {rig4.controller_ip} ") in (1, 2)
    st = ctl_cli("status", str(topo), "--json")
    status = json.loads(st.stdout)
    assert status["ready"] is True and status["probe_from"] == "head", st.stdout + st.stderr
    assert [n["alive"] for n in status["nodes"]] == [True] * 4
    human = ctl_cli("status", str(topo))
    assert f"{url} (serving, checked on rank 0)" in human.stdout, human.stdout + human.stderr
    logs = ctl_cli("logs", str(topo), "--node", "3", "--lines", "50")
    assert logs.returncode == 0 and f"[3 {nodes[3]['host']}]" in logs.stdout, logs.stdout + logs.stderr
    stop = ctl_cli("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert json.loads(ctl_cli("status", str(topo), "--json").stdout)["status"] == "stopped"


@pytest.mark.timeout(120)
def test_worker_killed_during_startup_stops_all_and_names_it(deployments: Deployments, rig4: HostRig,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    topo = deployments.topology("it-kill-start", launch={"ready_timeout_s": 600})
    proc = start_k3deploy("launch", topo, "--skip-preflight")  # about supervision
    victim = rig4.hosts[2]
    try:
        assert wait_for(lambda: engine_running(rig4, victim.name), 60)
        store = StateStore(deployments.state_dir)
        assert store.require("it-kill-start").status == "starting"  # still loading: not ready yet
        t0 = time.monotonic()
        rig4.kill_host_processes(victim)
        figures.fault_injected()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err
    assert f"rank 2 ({victim.mgmt_ip}): its process is gone" in err and "every node was stopped" in err
    assert took < 120, took  # on the kill, not the 600 s readiness deadline
    assert hosts_empty(rig4)
    rec = StateStore(deployments.state_dir).require("it-kill-start")
    assert rec.status == "failed" and rec.failure is not None and rec.failure.rank == 2
    with capsys.disabled():
        print(f"\nworker killed during start-up: launch exited (all stopped) {took:.1f} s after the kill")


@pytest.mark.timeout(150)
def test_worker_killed_after_ready_supervisor_stops_all(deployments: Deployments, rig4: HostRig,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    topo = deployments.topology("it-kill-ready")
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
    assert run.returncode == 0, run.stderr
    store = StateStore(deployments.state_dir)
    supervisor = store.require("it-kill-ready").owner
    assert supervisor is not None and supervisor.alive()
    victim = rig4.hosts[2]
    t0 = time.monotonic()
    rig4.kill_host_processes(victim)
    figures.fault_injected()
    others = [h for h in rig4.hosts if h is not victim]
    # Bounded for a loaded machine; what shows supervision stopped the group is the supervisor's log order.
    assert wait_for(lambda: not any(engine_running(rig4, h.name) for h in others) and not supervisor.alive(), 90)
    took = time.monotonic() - t0
    deployments.failed_status(topo, "it-kill-ready", 2, victim.mgmt_ip)
    assert hosts_empty(rig4)
    assert_supervisor_stopped_group(Path(deployments.state_dir) / "it-kill-ready.supervisor.log", 2, [0, 1, 3])
    with capsys.disabled():
        print(f"\nworker killed after ready: every node stopped {took:.1f} s after the kill")


@pytest.mark.timeout(150)
def test_control_network_outage_is_not_a_node_failure(deployments: Deployments, rig4: HostRig) -> None:
    """Every node's management link (the one SSH uses) down for a while: the engines keep running on the
    private network, the supervisor keeps watching, and after the outage the deployment is still ready."""
    topo = deployments.topology("it-outage")
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
    assert run.returncode == 0, run.stderr
    log = deployments.state_dir / "it-outage.supervisor.log"
    for host in rig4.hosts:
        rig4.set_link(host, host.mgmt_iface, up=False)
    figures.fault_injected()
    try:
        assert wait_for(lambda: "group: unreachable no node answers" in log.read_text(), 60, 0.5), log.read_text()
    finally:
        for host in rig4.hosts:
            rig4.set_link(host, host.mgmt_iface, up=True)
    assert wait_for(lambda: "group: reachable nodes answer again" in log.read_text(), 60, 0.5), log.read_text()
    status = json.loads(cli("status", str(topo), "--json").stdout)
    assert status["status"] == "ready" and status["ready"] is True and status["supervised"] is True
    assert [n["alive"] for n in status["nodes"]] == [True] * 4 and status["failure"] is None
    assert status["probe_from"] == "here"  # launched from where rank 0's private ip is reachable
    # Asked from a login node that cannot reach rank 0's private ip: readiness is checked on rank 0.
    elsewhere = cli("status", topo, "--json", timeout_s=60, prefix=("ip", "netns", "exec", rig4.controller()))
    status = json.loads(elsewhere.stdout)
    assert status["ready"] is True and status["probe_from"] == "head", elsewhere.stdout + elsewhere.stderr
    assert cli("stop", str(topo)).returncode == 0
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
