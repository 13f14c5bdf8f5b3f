"""Replicas behind a real router over SSH on the namespace rig: 2 replicas x 2 hosts of the stand-in behind smg
(SGLang mimic) and behind vllm-router (vLLM mimic), the router on this host. One `k3deploy launch`; status
shows both replicas healthy in the router's /workers; requests through the router are served by both; a
replica's node killed while serving is restarted within the budget; killed again with the budget spent it stays
down, is named, and the router sends it nothing while the other serves; the router killed is named; stop leaves nothing on any host and no router here. `k3deploy rollout` under a steady
client stream fails no request and never leaves fewer than 1 of 2 healthy in /workers (polled every 0.5 s);
a rollout whose new replica fails readiness stops there, names it and the stage, and the other serves."""
from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from k3deploy.records.store import StateStore
from tests.integration.sim_deployments import Deployments, hosts_empty
from tests.integration.test_router_tables import VENV, needs_routers
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.ports import closed_port
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, needs_routers]


def _service(d: Deployments, name: str, router: str, mimic: str, backoff_s: float = 1) -> tuple[Path, int]:
    topo = d.topology(name, launch={"restart": {"max": 1, "backoff_s": backoff_s}, "ready_timeout_s": 120})
    doc: dict[str, Any] = yaml.safe_load(topo.read_text())
    port = closed_port()
    doc["parallel"] = {"tp": 2, "ep": 2}
    doc["replicas"] = 2
    doc["engine"]["mimic"] = mimic
    doc["engine"]["launcher"] = [*doc["engine"]["launcher"][:-1], mimic]
    doc["router"] = {"kind": router, "port": port, "metrics_port": closed_port(), "python": str(VENV / "bin/python"),
                     "health_check_interval_s": 1, "health_failure_threshold": 2, "health_success_threshold": 1}
    d.names += [f"{name}-r0", f"{name}-r1", f"{name}-router"]
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    return topo, port


def _complete(port: int, n: int) -> list[str]:
    """n completions through the router; who served each (smg names the worker; '' when the router does not)."""
    out = []
    for i in range(n):
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
            "model": "kimi-k3-tiny", "prompt": f"{uuid.uuid4().hex} {i}", "max_tokens": 1})
        assert r.status_code == 200, r.text
        out.append(r.headers.get("x-smg-routed-worker-id", ""))
    return out


def _status(topo: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cli("status", str(topo), "--json").stdout)
    return doc


def _router_gone(store: StateStore, name: str) -> bool:
    rec = store.load(f"{name}-router")
    return rec is None or all(n.handle is None or not Path(f"/proc/{n.handle.pid}").exists() for n in rec.nodes)


@pytest.mark.timeout(600)
def test_two_replicas_behind_smg_over_ssh(deployments: Deployments, rig4: HostRig) -> None:
    topo, port = _service(deployments, "it-svc-smg", "smg", "sglang")  # restart max 1
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=400)
    assert run.returncode == 0, run.stderr
    svc = json.loads(run.stdout)
    assert svc["status"] == "ready", svc
    st = _status(topo)
    assert st["status"] == "ready" and [r["router_healthy"] for r in st["replicas"]] == [True, True], st
    urls = {r["url"] for r in st["replicas"]}
    assert set(_complete(port, 16)) == urls

    # Restarted within the budget: replica 0's second node killed while serving, the group relaunched.
    rig4.kill_host_processes(rig4.hosts[1])
    assert wait_for(lambda: len(store.require("it-svc-smg-r0").attempts) == 2
                    and _status(topo)["status"] == "ready", 240), _status(topo)
    assert wait_for(lambda: set(_complete(port, 8)) == urls, 60)

    # The budget spent, the same node killed again: replica 0 stays down, named; the router stops sending to it.
    rig4.kill_host_processes(rig4.hosts[1])
    assert wait_for(lambda: store.require("it-svc-smg-r0").status == "failed", 120), store.require("it-svc-smg-r0")
    assert wait_for(lambda: _status(topo)["replicas"][0]["router_healthy"] is False, 60), _status(topo)
    st = _status(topo)
    assert st["status"] == "degraded" and st["replicas"][0]["problem"] != "" and st["replicas"][1]["problem"] == "", st
    assert "it-svc-smg-r0" in cli("status", str(topo)).stdout
    assert set(_complete(port, 4)) == {st["replicas"][1]["url"]}
    assert store.require("it-svc-smg-r0").status == "failed"  # held down for the whole check

    router = store.require("it-svc-smg-router").nodes[0].handle
    assert router is not None
    os.killpg(router.pid, signal.SIGKILL)  # the router's whole group: nothing restarts it from inside
    assert wait_for(lambda: "it-svc-smg-router" in _status(topo)["router_problem"]
                    or len(store.require("it-svc-smg-router").attempts) == 2, 30), _status(topo)

    stop = cli("stop", str(topo), timeout_s=120)
    assert stop.returncode == 0, stop.stderr
    assert "it-svc-smg: stopped" in stop.stdout
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert wait_for(lambda: _router_gone(store, "it-svc-smg"), 20)
    assert _status(topo)["status"] == "stopped"


@pytest.mark.timeout(900)
def test_two_replicas_behind_vllm_router_over_ssh(deployments: Deployments, rig4: HostRig) -> None:
    topo, port = _service(deployments, "it-svc-vr", "vllm-router", "vllm")
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=400)
    assert run.returncode == 0, run.stderr
    st = _status(topo)
    assert st["status"] == "ready" and [r["router_healthy"] for r in st["replicas"]] == [True, True], st
    assert len(_complete(port, 8)) == 8
    # vllm-router names no worker: validate names who served from each replica's own finished count.
    val = cli("validate", str(topo), "--json", "--only", "kernels,short,prefix-cache", timeout_s=600)
    stages = {s["name"]: s for s in json.loads(val.stdout)["stages"]}
    assert val.returncode == 0 and list(stages) == ["kernels[r0]", "kernels[r1]", "short", "prefix-cache"], stages
    for name in ("short", "prefix-cache"):
        assert set(stages[name]["results"]["served_by"]) <= {"it-svc-vr-r0", "it-svc-vr-r1"}, stages[name]
        assert stages[name]["results"]["served_by"] and "finished-requests counter" in stages[name]["evidence"]
    turns = stages["prefix-cache"]["results"]["served_by_turn"]
    assert len(turns) == 2 and turns[0] == turns[1] and len(turns[0]) == 1, turns
    stream = Stream(port)  # vllm-router drops a worker at once: the drain waits on the replica's own gauge
    try:
        roll = cli("rollout", str(topo), timeout_s=600)
    finally:
        stream.end()
    assert roll.returncode == 0, roll.stderr
    assert stream.failed == [] and stream.ok > 0 and stream.fewest >= 1, (stream.failed[:5], stream.fewest)
    stop = cli("stop", str(topo), timeout_s=120)
    assert stop.returncode == 0, stop.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert wait_for(lambda: _router_gone(store, "it-svc-vr"), 20)


@pytest.mark.timeout(300)
def test_launch_checks_the_router_machine_over_ssh_before_any_replica(
        deployments: Deployments, rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    """The router on the first rig host, its port held there by another process: launch exits 4 with the check's
    line naming that host, the port and its holder, and the fix; no replica or router record, nothing started
    on any host."""
    topo, port = _service(deployments, "it-svc-gate", "smg", "sglang")
    host = rig4.hosts[0]
    doc = yaml.safe_load(topo.read_text())
    doc["router"]["runs_on"] = host.mgmt_ip
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    hold = f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); time.sleep(600)"
    try:
        rig4.exec(host, ["sh", "-c", f"setsid python3 -c {shlex.quote(hold)} >/dev/null 2>&1 </dev/null &"])
        knock = f"import socket; socket.create_connection(({host.mgmt_ip!r}, {port}), 2)"
        assert wait_for(lambda: rig4.exec(host, ["python3", "-c", knock]).returncode == 0, 30)
        t0 = time.monotonic()
        run = cli("launch", str(topo), "--json", timeout_s=200)
        took = time.monotonic() - t0
    finally:
        rig4.kill_host_processes(host)
    with capsys.disabled():
        print(f"\nlaunch refused by the router's checks over SSH: exit {run.returncode} in {took:.1f} s\n{run.stderr}")
    assert run.returncode == 4, run.stderr
    assert f"router-port: rank 0 ({host.mgmt_ip}): cannot listen on " in run.stderr and f":{port}: Address " \
        "already in use, held by pid" in run.stderr and "python3" in run.stderr, run.stderr
    assert "router.port / router.metrics_port" in run.stderr and "router-python" not in run.stderr, run.stderr
    svc = json.loads(run.stdout)
    assert (svc["status"], svc["preflight"]) == ("failed", "failed") and host.mgmt_ip in svc["cause"], svc
    store = StateStore(deployments.state_dir)
    assert [n for n in ("it-svc-gate-r0", "it-svc-gate-r1", "it-svc-gate-router") if store.load(n)] == []
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}


class Stream:
    """A steady client through the router (pause_s between its requests) and a /workers poll every 0.5 s,
    until stopped."""

    def __init__(self, port: int, model: str = "kimi-k3-tiny", pause_s: float = 0.0) -> None:
        self.port, self.model, self.ok, self.failed, self.fewest = port, model, 0, [], 99  # type: ignore[var-annotated]
        self.pause_s = pause_s
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client), threading.Thread(target=self._poll)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        while not self.stop.is_set():
            try:
                r = httpx.post(f"http://127.0.0.1:{self.port}/v1/completions", timeout=60, json={
                    "model": self.model, "prompt": uuid.uuid4().hex, "max_tokens": 2})
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"HTTP {r.status_code}: {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.failed.append(repr(exc))
            self.stop.wait(self.pause_s)

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            workers = httpx.get(f"http://127.0.0.1:{self.port}/workers", timeout=5).json()["workers"]
            self.fewest = min(self.fewest, sum(1 for w in workers if w["is_healthy"]))

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)


@pytest.mark.timeout(900)
def test_rollout_behind_smg_drops_no_request_and_stops_at_a_failing_replica(
        deployments: Deployments, rig4: HostRig, capsys: pytest.CaptureFixture[str]) -> None:
    topo, port = _service(deployments, "it-svc-roll", "smg", "sglang")
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", timeout_s=400)
    assert run.returncode == 0, run.stderr
    stream = Stream(port)
    try:
        roll = cli("rollout", str(topo), timeout_s=600)
    finally:
        stream.end()
    assert roll.returncode == 0, roll.stderr
    assert stream.failed == [] and stream.ok > 0, stream.failed[:5]
    assert stream.fewest >= 1, stream.fewest
    assert [len(store.require(f"it-svc-roll-r{i}").attempts) for i in (0, 1)] == [1, 1]  # new records
    assert "it-svc-roll-r1: serving again" in roll.stderr
    with capsys.disabled():
        print(f"\nrollout over SSH: {stream.ok} requests through smg, 0 failed, fewest healthy {stream.fewest}")

    doc = yaml.safe_load(topo.read_text())
    doc["engine"]["env"] = {"K3SIM_FAULT": "crash_after_load"}  # the new version cannot get ready
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    bad = cli("rollout", str(topo), timeout_s=600)
    assert bad.returncode == 4, bad.stderr
    assert "rollout stopped at it-svc-roll-r0, stage start" in bad.stderr, bad.stderr
    st = _status(topo)
    assert st["status"] == "degraded" and "rollout start" in st["replicas"][0]["problem"], st
    assert st["replicas"][1]["problem"] == "" and st["replicas"][1]["router_healthy"] is True, st
    assert set(_complete(port, 4)) == {st["replicas"][1]["url"]}  # N-1 serve
    stop = cli("stop", str(topo), timeout_s=120)
    assert stop.returncode == 0, stop.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert wait_for(lambda: _router_gone(store, "it-svc-roll"), 20)
