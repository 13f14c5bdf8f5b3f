"""Prefill/decode faults through `k3deploy launch` on the SSH rig, the real smg in PD mode in front of stand-in
roles (1P1D): a prefill whose bootstrap server listens on another port than the router's `--prefill URL PORT`
(a site launcher overriding the rendered flag, which plan cannot see) fails the launch's completion through the
router, naming smg's answer; a prefill dying mid-transfer fails the request clearly and leaves the service
failed, the prefill named; stop leaves nothing either way; a slow decode fails `effort` naming the decode role's
TPOT against its prediction. (A zeroed or dropped KDA state: test_pd_service_ssh.py.)"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from k3deploy.records.store import StateStore
from tests.integration.sim_deployments import Deployments, hosts_empty
from tests.integration.test_pd_service_ssh import _chat, _pd_topology, _status, _stop_leaves_nothing
from tests.integration.test_router_tables import needs_routers
from tests.integration.test_sim_pd import FACTS, QUESTION
from tests.k3deploy_cli import run_k3deploy as cli
from tests.polling import wait_for
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, needs_routers]
ROUTER_PORT = 18998  # what _pd_topology sets as roles.transfer.bootstrap_port (the router's --prefill URL PORT)


@pytest.mark.timeout(400)
def test_a_bootstrap_port_the_router_was_not_given_fails_the_launch(deployments: Deployments,
                                                                   rig4: HostRig, tmp_path: Path) -> None:
    """The site's launcher appends its own --disaggregation-bootstrap-port (the engine's parser keeps the
    last): both instances are ready and smg registers both (it never asks the bootstrap port), but the decode
    cannot reach the prefill's bootstrap server at the port the router hands it, so no completion passes
    the router (smg then opens the prefill's circuit: 503 "No available prefill workers") and launch fails at
    its readiness, naming the router's answer; what started is stopped."""
    wrapper = tmp_path / "site-sglang.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m k3deploy.sim serve --mimic sglang "$@" '
                       f"--disaggregation-bootstrap-port {ROUTER_PORT + 100}\n")
    wrapper.chmod(0o755)
    name = "it-pdb"
    # Launch waits out the whole ready_timeout_s at the router (its 503s are not fatal), so the bound is what
    # the instances need to load on a loaded 2-core machine (~10-20 s seen) with room: smg opens the prefill's
    # circuit within ~2 s of its first completions (the decode's fetch fails at once).
    topo, _ = _pd_topology(deployments, name, prefill=[[0]], decode=[[1]], tp=1, launcher=[str(wrapper)],
                           env={"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "10"}, ready_timeout_s=45)
    run = cli("launch", str(topo), "--skip-preflight", timeout_s=300)
    assert run.returncode == 4, (run.returncode, run.stdout, run.stderr)
    assert f"{name}-prefill0 rank 0 {rig4.hosts[0].mgmt_ip}: ready" in run.stderr, run.stderr
    assert f"{name}-decode0 rank 0 {rig4.hosts[1].mgmt_ip}: ready" in run.stderr, run.stderr
    assert "not a completion yet: /v1/completions: HTTP 503" in run.stderr, run.stderr
    assert "No available prefill workers" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    assert _status(topo)["status"] == "failed"


@pytest.mark.timeout(500)
def test_a_prefill_dying_mid_transfer_fails_the_request_and_the_service(deployments: Deployments,
                                                                       rig4: HostRig) -> None:
    """The prefill exits with half a room's KV on the wire (after launch's own completion): the request fails
    with an error, not an answer; the supervisor names the prefill instance; with no prefill left the service
    is failed (exit 4); stop leaves nothing."""
    name = "it-pdd"
    topo, port = _pd_topology(deployments, name, prefill=[[0]], decode=[[1]], tp=1,
                              fault="prefill_dies_mid_transfer:2")
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", "--json", timeout_s=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["status"] == "ready"
    # Launch's own two completions (the router's readiness, then one through it) were transfers 1 and 2.
    reply = _chat(port, [{"role": "user", "content": f"{FACTS} {QUESTION}"}])
    prefill0 = _status(topo)["replicas"][0]["url"]
    # smg makes 5 attempts (a 500 and a 502 are both retryable) and answers with the last one's error: the
    # prefill's refused connection ("PD disaggregation request failed", its URL), or, when the decode's answer
    # comes first, the decode's (its fetch from the dead prefill's bootstrap server failed). Which comes first is a
    # race inside the real router (each of the two seen in the retries of one request here); both name the prefill.
    assert (reply.status_code == 502 and "PD disaggregation request failed" in reply.text
            and f"{prefill0}/v1/chat/completions" in reply.text) or (
        reply.status_code == 500 and "decode_internal_error" in reply.text
        and "Failed to get kvcache from prefill instance, it might be dead" in reply.text), reply.text
    assert wait_for(lambda: _status(topo)["replicas"][0]["problem"] != "", 60), _status(topo)
    st = _status(topo)
    assert st["status"] == "failed" and [r["problem"] == "" for r in st["replicas"]] == [False, True], st
    text = cli("status", str(topo))
    assert text.returncode == 4 and f"prefill {name}-prefill0:" in text.stdout, text.stdout
    logs = cli("logs", str(topo), "--lines", "200").stdout
    assert "Failed to get kvcache from prefill instance" in logs, logs[-3000:]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{prefill0}/health", timeout=5)
    _stop_leaves_nothing(topo, rig4, store, name)


@pytest.mark.timeout(500)
def test_a_slow_decode_fails_effort_naming_the_decode_roles_tpot(deployments: Deployments, rig4: HostRig) -> None:
    """Every decode step 40x longer at K3SIM_SPEED 4 (10x slower than the planner's model of the `sim` GPU):
    effort's cold TPOT through the router falls far below the decode role's prediction. (The `sim` GPU has no
    scale-out figures, so the prefill role's TTFT is not predicted: said in the results, not judged.)"""
    name = "it-pds"
    topo, _ = _pd_topology(deployments, name, prefill=[[0]], decode=[[1]], tp=1, fault="slow_decode:40",
                           env={"K3SIM_SPEED": "4"})
    store = StateStore(deployments.state_dir)
    run = cli("launch", str(topo), "--skip-preflight", timeout_s=300)
    assert run.returncode == 0, run.stderr
    val = cli("validate", str(topo), "--only", "effort", "--json", timeout_s=400)
    assert val.returncode == 1, val.stdout
    effort = json.loads(val.stdout)["stages"][0]
    assert effort["name"] == "effort" and effort["status"] == "fail", effort
    assert "cold: the decode role's TPOT is far above its prediction" in effort["detail"], effort
    assert "prefill role" not in effort["detail"], effort
    assert "decode role TPOT" in effort["evidence"], effort
    assert "no scaleout_gbps" in effort["results"]["predicted_per_role"]["prefill"]["not_timed"], effort
    _stop_leaves_nothing(topo, rig4, store, name)
