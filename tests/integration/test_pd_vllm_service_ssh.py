"""vLLM-form prefill/decode roles behind the real vllm-router in PD mode (--vllm-pd-disaggregation
--kv-connector nixl), over SSH on the namespace rig: one `k3deploy launch` of a topology with `roles` and the
stand-in's vLLM mimic (NixlConnector, kv_both) starts each instance as its own deployment, then the router with
the rendered command; ready is a completion through the router. A long-context chat through the router is
answered from the KV and KDA state the decode read from the prefill host's NIXL side channel; status lists
every instance beside the router's view; `validate` passes across the roles; stop leaves nothing. 1P2D: both
decodes generate for requests the router hands them; one decode's node killed leaves the service degraded (the
router takes it out, the rest serve), both killed leave it failed (exit 4). A KDA state zeroed in the transfer
fails `long`."""
from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from k3deploy.records.store import StateStore
from tests.integration.sim_deployments import Deployments
from tests.integration.test_pd_service_ssh import (
    CLEAN_EFFORT_ENV,
    _answer,
    _chat,
    _status,
    _stop_leaves_nothing,
)
from tests.integration.test_pd_service_ssh import _pd_topology as pd_topology
from tests.integration.test_router_tables import needs_routers
from tests.integration.test_sim_pd import FACTS, QUESTION, RIGHT
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, needs_routers]
LAUNCHER = [sys.executable, "-m", "k3deploy.sim", "serve", "--mimic", "vllm"]
SIDE_CHANNEL_PORT = 15600
NODE_STAGES_1P1D = [f"{stage}[{inst}]" for inst in ("prefill0", "decode0") for stage in ("shards", "kernels", "topology")]


def _pd_topology(d: Deployments, name: str, prefill: list[list[int]], decode: list[list[int]],
                 tp: int, fault: str = "", env: dict[str, str] | None = None) -> tuple[Path, int]:
    """The smg test's topology with `roles` in the vLLM form: the stand-in's vLLM mimic over NIXL (its side
    channel), vllm-router here in PD mode."""
    topo, port = pd_topology(d, name, prefill, decode, tp, fault, env)
    doc: dict[str, Any] = yaml.safe_load(topo.read_text())
    doc["engine"].update({"mimic": "vllm", "launcher": LAUNCHER})
    doc["serving"]["prefix_cache"] = True
    doc["roles"]["transfer"] = {"backend": "nixl", "side_channel_port": SIDE_CHANNEL_PORT}
    doc["router"]["kind"] = "vllm-router"
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    return topo, port


def _finished(url: str) -> float:
    """The instance's own count of finished requests (vLLM's counter on its /metrics, asked from here)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def _launch(topo: Path, roles: list[str]) -> dict[str, Any]:
    """One `k3deploy launch`: the service ready, its instances of these roles in order."""
    run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=500)
    assert run.returncode == 0, run.stderr
    svc: dict[str, Any] = json.loads(run.stdout)
    assert svc["status"] == "ready" and [r["role"] for r in svc["replicas"]] == roles, svc
    return svc


def _validate(topo: Path) -> tuple[int, dict[str, Any]]:
    """`k3deploy validate --json`: its exit code and report."""
    val = cli("validate", str(topo), "--json", timeout_s=600)
    report: dict[str, Any] = json.loads(val.stdout)
    return val.returncode, report


def _kill(rig: HostRig, topo: Path, host: int, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Kill every process on one rig host; the first status (JSON) for which `until` holds."""
    rig.kill_host_processes(rig.hosts[host])
    seen: dict[str, Any] = {}

    def holds() -> bool:
        seen.clear()
        seen.update(_status(topo))
        return until(seen)

    assert wait_for(holds, 60), seen
    return seen


@pytest.mark.timeout(700)
def test_one_prefill_one_decode_behind_vllm_router_over_ssh(deployments: Deployments, rig4: HostRig) -> None:
    name = "it-pdv11"
    topo, port = _pd_topology(deployments, name, prefill=[[0, 1]], decode=[[2, 3]], tp=2, env=CLEAN_EFFORT_ENV)
    store = StateStore(deployments.state_dir)
    svc = _launch(topo, ["prefill", "decode"])
    assert [(r["name"], r["phase"]) for r in svc["replicas"]] == [(f"{name}-prefill0", "ready"),
                                                                   (f"{name}-decode0", "ready")], svc
    argv = store.require(f"{name}-router").jobs[0].argv
    prefill0, decode0 = (r["url"] for r in svc["replicas"])
    pairs = set(itertools.pairwise(argv))
    assert "--vllm-pd-disaggregation" in argv and ("--kv-connector", "nixl") in pairs, argv
    assert ("--prefill", prefill0) in pairs and ("--decode", decode0) in pairs, argv
    # Ready was a completion through the router that both instances' own counters saw.
    assert [r["served_through_router"] for r in svc["replicas"]] == [True, True], svc
    st = _status(topo)
    assert st["status"] == "ready", st
    assert [(r["role"], r["router_healthy"]) for r in st["replicas"]] == [("prefill", True), ("decode", True)], st

    turn1 = [{"role": "user", "content": f"{FACTS} {QUESTION}"}]
    before = {u: _finished(u) for u in (prefill0, decode0)}
    first = _chat(port, turn1)
    assert all(value in _answer(first) for value in RIGHT), _answer(first)
    assert all(_finished(u) == before[u] + 1 for u in (prefill0, decode0)), before  # one request, both roles
    turn2 = [*turn1, first.json()["choices"][0]["message"], {"role": "user", "content": QUESTION}]
    second = _chat(port, turn2)
    assert all(value in _answer(second) for value in RIGHT)
    # The prefill's hit (vLLM's decode reports remote_prefill_cached_tokens), turn 1's prompt at least.
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= first.json()["usage"]["prompt_tokens"], (cached, first.json()["usage"])

    code, report = _validate(topo)
    assert code == 0, report
    assert [(r["name"], r["status"]) for r in report["stages"]] == [
        *((n, "pass") for n in NODE_STAGES_1P1D), ("short", "pass"), ("vision", "pass"), ("long", "pass"),
        ("prefix-cache", "pass"), ("effort", "pass"), ("accuracy", "skip")], report
    assert report["not_implemented"] == []

    _stop_leaves_nothing(topo, rig4, store, name)


@pytest.mark.timeout(700)
def test_one_prefill_two_decodes_behind_vllm_router_over_ssh(deployments: Deployments, rig4: HostRig) -> None:
    name = "it-pdv12"
    topo, port = _pd_topology(deployments, name, prefill=[[0]], decode=[[1], [2]], tp=1)
    store = StateStore(deployments.state_dir)
    _launch(topo, ["prefill", "decode", "decode"])
    st = _status(topo)
    assert st["status"] == "ready" and all(r["router_healthy"] for r in st["replicas"]), st
    urls = [r["url"] for r in st["replicas"]]
    before = {u: _finished(u) for u in urls}
    for i in range(12):  # the random policy hands each request to either decode
        reply = _chat(port, [{"role": "user", "content": f"{os.urandom(4).hex()} {FACTS} {QUESTION}"}])
        assert all(value in _answer(reply) for value in RIGHT), (i, _answer(reply))
    after = {u: _finished(u) for u in urls}
    assert after[urls[0]] == before[urls[0]] + 12, (before, after)  # the one prefill took every request
    assert all(after[u] > before[u] for u in urls[1:]), (before, after)
    assert sum(after[u] - before[u] for u in urls[1:]) == 12, (before, after)

    # decode1's only node dies while the others serve: named, and the router takes it out.
    st = _kill(rig4, topo, 2, lambda s: s["replicas"][2]["problem"] != "" and s["replicas"][2]["router_healthy"]
               is False)
    assert st["status"] == "degraded" and [r["problem"] == "" for r in st["replicas"]] == [True, True, False], st
    for _ in range(3):  # the prefill and decode0 serve every request
        assert all(v in _answer(_chat(port, [{"role": "user", "content": f"{FACTS} {QUESTION}"}])) for v in RIGHT)
    _kill(rig4, topo, 1, lambda s: s["status"] == "failed")  # decode0 too: no decode serves, so nothing does
    assert cli("status", str(topo)).returncode == 4
    _stop_leaves_nothing(topo, rig4, store, name)


@pytest.mark.timeout(700)
def test_a_zeroed_kda_transfer_fails_the_long_stage_through_vllm_router(deployments: Deployments,
                                                                        rig4: HostRig) -> None:
    """The prefill's side channel serves a zeroed KDA state: the decode answers fluently and wrongly; `long`
    fails with the answer as evidence while every node stage and `short` pass."""
    name = "it-pdvz"
    topo, _ = _pd_topology(deployments, name, prefill=[[0]], decode=[[1]], tp=1, fault="transfer_kda_zeroed")
    store = StateStore(deployments.state_dir)
    _launch(topo, ["prefill", "decode"])
    code, report = _validate(topo)
    stages = {r["name"]: r for r in report["stages"]}
    assert code == 1, report
    assert all(stages[n]["status"] == "pass" for n in (*NODE_STAGES_1P1D, "short")), stages
    long = stages["long"]
    assert long["status"] == "fail" and "facts lost" in long["detail"], long
    assert "answer:" in long["evidence"], long
    _stop_leaves_nothing(topo, rig4, store, name)
