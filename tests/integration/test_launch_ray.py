"""`k3deploy launch --executor ray` on a real Ray cluster spanning four network-namespace hosts (one Ray node
per host, each with its own node IP) running the stand-in engine: ready/status/logs/stop leave nothing
behind; a worker's engine killed after ready, or its agent actor dying, stops every node and names it; a
node whose IP no Ray node has is refused before anything starts; an unreachable cluster is one message."""
from __future__ import annotations

import json
import select
import subprocess
import time

import pytest

from k3deploy.records.store import StateStore
from tests import figures
from tests.integration.sim_deployments import (
    GLOO,
    RAY_CLI_ENV,
    RayDeployments,
    agents,
    engine_pids,
    engine_running,
    nothing_left,
    tagged,
)
from tests.k3deploy_cli import run_k3deploy as run_cli
from tests.k3deploy_cli import start_k3deploy
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.ray_cluster import RAY_ENV, RayRig

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]


def cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout_s=timeout_s, env=RAY_CLI_ENV)


# The bound covers the run's Ray cluster start (the first test to use it sets it up) and launch's preflight.
@pytest.mark.timeout(240)
def test_launch_ready_status_logs_stop_leave_nothing(deployments: RayDeployments, rig4: HostRig, ray4: RayRig,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 0 takes 4 s to honour SIGTERM, as a draining engine does: the supervisor stops the nodes over Ray for
    # longer than the 3 s after which Ray's own SIGTERM handler used to abort a driver (SIGABRT).
    topo = deployments.topology("ray-e2e", env={**GLOO, "K3SIM_FAULT": "slow_stop:4", "K3SIM_FAULT_RANK": "0"},
                                launch={"executor": "ssh", "ray_address": "10.0.0.1:1", "stop_grace_s": 15})
    t0 = time.monotonic()
    run = cli("launch", str(topo), "--executor", "ray", "--ray-address", ray4.address, "--json")
    launch_s = time.monotonic() - t0
    assert run.returncode == 0, run.stderr
    rec = json.loads(run.stdout)
    assert rec["status"] == "ready" and rec["executor"] == "ray" and rec["owner"]["role"] == "supervisor"
    assert {j["target"]["ray_address"] for j in rec["jobs"]} == {ray4.address}  # the CLI option is recorded
    attempt = rec["attempts"][0]
    for node, host in zip(rec["nodes"], rig4.hosts):
        handle = node["handle"]
        # The agent's name is not recorded: the executor derives it from the tag (as 0.2 recorded it).
        assert "container" not in handle and handle["tag"].startswith("ray-e2e.")  # ProcessHandle.container is gone (no executor set it)
        assert handle["pid"] in rig4.pids(host)  # a PID as the host sees it: the engine runs on its node
        assert engine_running(rig4, host.name) and len(agents(rig4, host.name)) == 1
    with capsys.disabled():
        print(f"\nRay cluster (4 hosts + driver node) up in {ray4.timings['up_s']:.1f} s; "
              f"4 hosts through Ray: launch to ready {attempt['ready_at'] - attempt['started_at']:.1f} s "
              f"(CLI wall {launch_s:.1f} s)")

    st = cli("status", str(topo), "--json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["status"] == "ready" and status["ready"] is True and status["supervised"] is True
    assert [n["alive"] for n in status["nodes"]] == [True] * 4 and status["executor"] == "ray"

    logs = cli("logs", str(topo), "--node", "0", "--node", "2", "--lines", "200")
    assert logs.returncode == 0, logs.stderr
    prefixes = {line.split("]")[0] + "]" for line in logs.stdout.splitlines()}
    assert prefixes == {f"[0 {rig4.hosts[0].mgmt_ip}]", f"[2 {rig4.hosts[2].mgmt_ip}]"}
    assert "The server is fired up and ready to roll!" in logs.stdout
    assert "k3sim: torch.distributed gloo group up" in logs.stdout  # real Gloo across the hosts

    follow = start_k3deploy("logs", topo, "--node", "1", "-f", "-n", "5", env=RAY_ENV)
    assert follow.stdout is not None
    first = select.select([follow.stdout], [], [], 30)[0] and follow.stdout.readline()
    assert first and first.startswith(f"[1 {rig4.hosts[1].mgmt_ip}] "), first  # following before the stop
    t0 = time.monotonic()
    stop = cli("stop", str(topo))
    stop_s = time.monotonic() - t0
    assert stop.returncode == 0, stop.stderr
    out, err = follow.communicate(timeout=30)  # the stream ends with the process
    assert follow.returncode == 0, err
    assert out.splitlines() and all(line.startswith(f"[1 {rig4.hosts[1].mgmt_ip}] ") for line in out.splitlines())
    assert nothing_left(rig4), {h.name: (tagged(rig4, h.name), agents(rig4, h.name)) for h in rig4.hosts}
    assert json.loads(cli("status", str(topo), "--json").stdout)["status"] == "stopped"
    assert cli("stop", str(topo)).returncode == 0  # idempotent
    # A graceful stop: rank 0 gets SIGTERM (a worker may see its head go first and exit on the closed
    # connection, as the engines' workers do; the head never leaves on a lost worker).
    assert "Received sigterm" in (deployments.tmp / "logs" / "ray-e2e-rank0.log").read_text()
    # The supervisor stopped every node itself and left on its own, its agents killed: not aborted part-way.
    supervisor_log = (deployments.state_dir / "ray-e2e.supervisor.log").read_text()
    assert supervisor_log.splitlines()[-1].endswith("supervisor exits; deployment stopped"), supervisor_log[-2000:]
    assert "SIGTERM received" not in supervisor_log and supervisor_log.count(": stopped") == 4, supervisor_log[-2000:]
    with capsys.disabled():
        print(f"stop through Ray: {stop_s:.1f} s")


@pytest.mark.timeout(300)
def test_worker_engine_killed_after_ready_stops_all_and_status_names_it(
        deployments: RayDeployments, rig4: HostRig, ray4: RayRig, capsys: pytest.CaptureFixture[str]) -> None:
    # Through the Ray client server this time (launch, supervisor and status), not the GCS address.
    topo = deployments.topology("ray-kill", launch={"ray_address": f"ray://{ray4.head.priv_ip}:10001"})
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
    assert run.returncode == 0, run.stderr
    store = StateStore(deployments.state_dir)
    supervisor = store.require("ray-kill").owner
    assert supervisor is not None and supervisor.alive()
    victim = rig4.hosts[2]
    engines = engine_pids(rig4, victim.name)
    assert len(engines) == 1
    t0 = time.monotonic()
    rig4.exec(victim, ["kill", "-KILL", str(engines[0])])
    figures.fault_injected()
    others = [h for h in rig4.hosts if h is not victim]
    # Seen in 27 s at load 18 (each Ray poll round is tasks on every node): a bound for a busy machine.
    assert wait_for(lambda: not any(engine_running(rig4, h.name) for h in others), 120)
    took = time.monotonic() - t0
    status = deployments.failed_status(topo, "ray-kill", 2, victim.mgmt_ip)
    assert status["failure"]["cause"].startswith("exited with status 137")
    assert nothing_left(rig4) and wait_for(lambda: not supervisor.alive(), 30)
    with capsys.disabled():
        print(f"\nworker engine killed after ready (Ray): every node stopped {took:.1f} s after the kill")


@pytest.mark.timeout(300)
def test_an_agent_actor_dying_stops_its_engine_and_the_group(
        deployments: RayDeployments, rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    topo = deployments.topology("ray-agent")
    run = cli("launch", str(topo), "--skip-preflight")  # about supervision
    assert run.returncode == 0, run.stderr
    victim = rig4.hosts[1]
    (agent,) = agents(rig4, victim.name)
    t0 = time.monotonic()
    rig4.exec(victim, ["kill", "-KILL", agent.split()[0]])  # the actor dies; nothing of it can clean up
    figures.fault_injected()
    assert wait_for(lambda: not any(engine_running(rig4, h.name) for h in rig4.hosts), 120)
    took = time.monotonic() - t0
    store = StateStore(deployments.state_dir)
    assert wait_for(lambda: store.require("ray-agent").status == "failed", 10)
    failure = store.require("ray-agent").failure
    assert failure is not None and failure.rank == 1 and failure.host == victim.mgmt_ip
    assert "the Ray agent k3-ray-agent.1." in failure.log_tail and "is gone" in failure.log_tail
    assert nothing_left(rig4)
    with capsys.disabled():
        print(f"\nagent actor killed: its engine and every other node stopped {took:.1f} s after the kill")


@pytest.mark.timeout(90)
def test_a_node_ip_no_ray_node_has_is_refused_before_anything_starts(deployments: RayDeployments, rig4: HostRig,
                                                                     ray4: RayRig) -> None:
    nodes = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    wrong = f"10.231.{rig4.subnet}.99"
    nodes[3]["ip"] = wrong  # e.g. Ray on that host picked another NIC
    figures.fault_injected()
    topo = deployments.topology("ray-wrong-ip", nodes=nodes)
    run = cli("launch", str(topo))
    assert run.returncode == 3, run.stderr
    first = next(line for line in run.stderr.splitlines() if line.startswith("error:"))
    assert first.startswith(f"error: {rig4.hosts[3].mgmt_ip}: no Ray node has IP {wrong} (the node's `ip`); "
                            "Ray sees: "), first
    for ip in [h.priv_ip for h in rig4.hosts] + [ray4.driver_ip]:
        assert f"{ip} (alive)" in first
    assert "--node-ip-address" in run.stderr
    assert nothing_left(rig4, 2)  # nothing was started anywhere
    rec = StateStore(deployments.state_dir).require("ray-wrong-ip")
    assert rec.status == "failed" and all(n.handle is None for n in rec.nodes)
    assert rec.failure is not None and rec.failure.rank == 3


@pytest.mark.timeout(60)
def test_an_unreachable_cluster_is_one_clear_message(deployments: RayDeployments, rig4: HostRig) -> None:
    address = f"{rig4.hosts[0].priv_ip}:6390"  # the head host, a port nothing listens on
    figures.fault_injected()
    topo = deployments.topology("ray-unreachable")
    t0 = time.monotonic()
    run = cli("launch", str(topo), "--ray-address", address)
    assert run.returncode == 3, run.stderr
    assert time.monotonic() - t0 < 60  # the 5 s probe, not ray.init's minutes
    lines = [line for line in run.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert lines[0].startswith(f"error: {rig4.hosts[0].mgmt_ip}: cannot reach the Ray cluster at {address}: "
                               "connection refused"), run.stderr
    assert lines[-1].startswith("hint: is Ray running there?") and "Traceback" not in run.stderr
    assert nothing_left(rig4, 2)
