"""What the SSH and Ray launch tests share: stand-in-engine topologies for a rig (the checkpoint is
tests/conftest.py's), a teardown that stops whatever a failed test left and reports it (the `deployments`
fixture of tests/integration/conftest.py asserts it found nothing), and the checks of what runs on the hosts."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from k3deploy.records.status import ACTIVE
from k3deploy.records.store import StateStore
from tests import figures
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.ray_cluster import RAY_ENV, RayRig

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = [sys.executable, "-m", "k3deploy.sim", "serve", "--mimic", "sglang"]
# One launch per launcher (SSH, Ray, Slurm) runs its stand-ins on torch.distributed over Gloo, as the engines: the
# rendered rendezvous (address, port, GLOO_SOCKET_IFNAME) held to real Gloo across the rig's hosts. The others
# use the stand-in's torch-free group (tests/conftest.py says why).
GLOO = {"K3SIM_GROUP": "gloo"}


class SimDeployments:
    """Writes stand-in-engine topologies (4 nodes, TP4/EP4, one per rig host) and, after the test, stops
    every deployment it wrote that is still active and reports it."""

    def __init__(self, rig: HostRig, checkpoint: Path, tmp: Path, launch: Mapping[str, Any],
                 env: Mapping[str, str] | None = None) -> None:
        self.rig, self.checkpoint, self.tmp = rig, checkpoint, tmp
        self.launch_defaults = dict(launch)
        self.cli_env = env
        self.names: list[str] = []

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    def topology(self, name: str, *, nodes: list[dict[str, Any]] | None = None, env: dict[str, str] | None = None,
                 launch: dict[str, Any] | None = None) -> Path:
        default = [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in self.rig.hosts]
        doc = {
            "name": name,
            "model": {"id": "kimi-k3-tiny", "path": str(self.checkpoint)},
            "hardware": {"gpu": "sim", "gpus_per_node": 1},
            "nodes": nodes or default,
            "engine": {"kind": "sim", "mimic": "sglang", "port": 18000, "launcher": LAUNCHER, "env": env or {}},
            "parallel": {"tp": 4, "ep": 4},
            "serving": {"context_length": 32768, "max_running_requests": 16},
            "launch": {"port": 29500, "dist_timeout_s": 20, "ready_timeout_s": 60, "stop_grace_s": 3,
                       "log_dir": str(self.tmp / "logs"), "state_dir": str(self.state_dir),
                       **self.launch_defaults, **(launch or {})},
        }
        self.names.append(name)
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def failed_status(self, topo: Path, name: str, rank: int, host: str) -> dict[str, Any]:
        """After the group was torn down: the record says failed, `status` (JSON and text) names the node and
        exits 4, and nobody supervises any more; the JSON status for further checks."""
        store = StateStore(self.state_dir)
        assert wait_for(lambda: store.require(name).status == "failed", 10), store.require(name).status
        run = cli("status", str(topo), "--json", env=self.cli_env)
        assert run.returncode == 4, run.stderr  # the documented exit code of `status` of a failed deployment
        status: dict[str, Any] = json.loads(run.stdout)
        assert status["status"] == "failed" and status["supervised"] is False, status
        assert (status["failure"]["rank"], status["failure"]["host"]) == (rank, host), status["failure"]
        text = cli("status", str(topo), env=self.cli_env)
        assert text.returncode == 4 and f"rank {rank} ({host})" in text.stdout, text.stdout + text.stderr
        return status

    def stop_leftovers(self) -> list[str]:
        """Stop every written deployment still active or owned, counting its running nodes and owner in the
        reliability figures (nodes left running); one line per deployment that was."""
        problems = []
        store = StateStore(self.state_dir)
        for name in self.names:
            rec = store.load(name) if store.path(name).exists() else None
            owned = rec is not None and rec.owner is not None and rec.owner.alive()
            if rec is not None and (rec.status in ACTIVE or owned):
                problems.append(f"{name} left {rec.status}")
                running = [n for n in rec.nodes if n.handle is not None and n.phase != "stopped"]
                figures.add(figures.NODES_LEFT, len(running) + owned)
                cli("stop", name, "--state-dir", str(self.state_dir), env=self.cli_env)
        return problems

    def left_on_hosts(self) -> dict[str, list[str]]:
        """What of any deployment still runs on each host once the test is over (after a short grace)."""
        raise NotImplementedError

    def remove(self, left: dict[str, list[str]]) -> None:
        """Remove what `left_on_hosts` found (a rig that cannot, leaves it to its teardown)."""

    def cleanup(self) -> list[str]:
        """After a test: stop its deployments, then count (nodes left running) and remove anything still on a
        host; one line per thing that had to be cleaned."""
        problems = self.stop_leftovers()
        left = self.left_on_hosts()
        if any(left.values()):
            figures.add(figures.NODES_LEFT, sum(map(len, left.values())))
            problems.append(f"processes left on hosts: {left}")
            self.remove(left)
        return problems


RAY_CLI_ENV = {**os.environ, **RAY_ENV}


def hosts_empty(rig: HostRig, timeout_s: float = 10.0) -> bool:
    """No process but the sshd master in any host (closed SSH sessions get a moment to exit)."""
    return wait_for(lambda: not any(rig.pids(h) for h in rig.hosts), timeout_s)


def engine_running(rig: HostRig, host: str) -> bool:
    """The stand-in engine process exists on the host."""
    return bool(engine_pids(rig, host))


def engine_pids(rig: HostRig, host: str) -> list[int]:
    """Host-local PIDs of the stand-in engine processes on a host."""
    out = rig.exec(host, ["ps", "-eo", "pid=,args="]).stdout
    return [int(line.split()[0]) for line in out.splitlines()
            if line.split(None, 1)[1].startswith(sys.executable) and "k3deploy.sim serve" in line]


def agents(rig: HostRig, host: str) -> list[str]:
    """Ray agent actors (their worker processes) alive on a host."""
    out = rig.exec(host, ["ps", "-eo", "pid=,args="]).stdout
    return [line.strip() for line in out.splitlines() if "ray::NodeAgent" in line]


def tagged(rig: HostRig, host: str) -> list[int]:
    """Processes on a host that carry any k3deploy tag (engines, wrappers, watchdogs)."""
    found = []
    for pid in rig.pids(host, root_ns=True):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"K3DEPLOY_RUN=" in env:
            found.append(pid)
    return found


def nothing_left(rig: HostRig, timeout_s: float = 30.0) -> bool:
    """No engine, no k3deploy-tagged process and no agent actor on any host (Ray's own processes stay)."""
    return wait_for(lambda: not any(tagged(rig, h.name) or agents(rig, h.name) for h in rig.hosts), timeout_s)


def kill_agents(rig: HostRig) -> None:
    """SIGKILL every agent actor on the Ray hosts (max_restarts 0: it stays dead, and the watchdog of its
    process group then stops the group)."""
    for h in rig.hosts:
        pids = [line.split()[0] for line in agents(rig, h.name)]
        if pids:
            rig.exec(h, ["kill", "-9", *pids])


def remove_from_ray_hosts(rig: HostRig) -> None:
    """SIGKILL every agent actor and every k3deploy-tagged process on the Ray hosts; Ray's own stay."""
    kill_agents(rig)
    for h in rig.hosts:
        for pid in tagged(rig, h.name):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


class Deployments(SimDeployments):
    """SSH topologies for the rig; nothing of them may be left on any host afterwards."""

    def __init__(self, rig: HostRig, checkpoint: Path, tmp: Path) -> None:
        super().__init__(rig, checkpoint, tmp, {"executor": "ssh", "ssh": {
            "user": "root", "key": str(rig.key_path), "known_hosts": str(rig.known_hosts_path),
            "connect_timeout_s": 2}})

    def left_on_hosts(self) -> dict[str, list[str]]:
        """Every process on a host but its sshd master (closed SSH sessions get a moment to exit)."""
        hosts_empty(self.rig, 5.0)
        return {h.name: [str(p) for p in self.rig.pids(h)] for h in self.rig.hosts}

    def remove(self, left: dict[str, list[str]]) -> None:
        for h in self.rig.hosts:
            self.rig.kill_host_processes(h)


class RayDeployments(SimDeployments):
    """Topologies for the Ray cluster; whatever a failed test leaves is stopped and reported."""

    def __init__(self, rig: HostRig, cluster: RayRig, checkpoint: Path, tmp: Path) -> None:
        super().__init__(rig, checkpoint, tmp, {"executor": "ray", "ray_address": cluster.address},
                         env=RAY_CLI_ENV)
        self.cluster = cluster

    def left_on_hosts(self) -> dict[str, list[str]]:
        """k3deploy-tagged processes and agent actors on each host (Ray's own processes stay)."""
        nothing_left(self.rig)
        return {h.name: [*map(str, tagged(self.rig, h.name)), *agents(self.rig, h.name)] for h in self.rig.hosts}
