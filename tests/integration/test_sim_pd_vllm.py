"""The real vllm-router in PD mode (--vllm-pd-disaggregation --kv-connector nixl) in front of stand-in vLLM
servers with the NixlConnector: the prefill answers with kv_transfer_params, the decode reads the KV and
KDA state from the prefill's side channel; a zeroed state answers wrongly, a TP mismatch fails the request
(or is recomputed under kv_load_failure_policy recompute)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import NodeSet, SimNode, free_ports
from tests.integration.test_sim_pd import FACTS, QUESTION, RIGHT, VENV, needs_routers

pytestmark = pytest.mark.integration
PREFILL_IP, DECODE_IP = "127.0.0.41", "127.0.0.42"
FLAGS = ["--max-model-len", "32768", "--served-model-name", "m", "--reasoning-parser", "kimi_k3"]
ASK: Any = [{"role": "user", "content": f"{FACTS} {QUESTION}"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kimi-k3-tiny")
    write_checkpoint(path)
    return path


@pytest.fixture
def pd_vllm(model: Path, tmp_path: Path) -> Iterator[Any]:
    """A factory: (router URL, prefill, decode) for a prefill fault, the decode's TP and failure policy."""
    routers: list[subprocess.Popen[bytes]] = []
    with NodeSet(tmp_path / "logs") as ns:

        def start(prefill_fault: str = "", decode_tp: int = 1, policy: str = "fail") -> tuple[str, SimNode, SimNode]:
            api, side_p, side_d, router_port, metrics = free_ports(5)
            config = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                 "kv_load_failure_policy": policy})
            base = ["--mimic", "vllm", str(model), "--host", "0.0.0.0", "--port", str(api), *FLAGS,
                    "--kv-transfer-config", config]
            env = {"K3SIM_SPEED": "50"}
            prefill = ns.start("prefill", base, {**env, "VLLM_HOST_IP": PREFILL_IP, "K3SIM_FAULT": prefill_fault,
                                                 "VLLM_NIXL_SIDE_CHANNEL_HOST": PREFILL_IP,
                                                 "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_p)})
            decode = ns.start("decode", [*base, "--tensor-parallel-size", str(decode_tp)],
                              {**env, "VLLM_HOST_IP": DECODE_IP, "VLLM_NIXL_SIDE_CHANNEL_HOST": DECODE_IP,
                               "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_d)})
            for node in (prefill, decode):
                node.wait_for("Application startup complete", 120)
            log = tmp_path / "router.log"
            argv = [str(VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(router_port),
                    "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--policy", "random",
                    "--prefill", f"http://{PREFILL_IP}:{api}", "--decode", f"http://{DECODE_IP}:{api}",
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
            with log.open("wb") as out:
                router = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            routers.append(router)
            deadline = time.monotonic() + 120
            while "Starting server on" not in log.read_text(errors="replace"):
                assert router.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
            return f"http://127.0.0.1:{router_port}", prefill, decode

        yield start
        for router in routers:
            if router.poll() is None:
                os.killpg(router.pid, signal.SIGKILL)
            router.wait(timeout=30)


def _chat(url: str) -> httpx.Response:
    body = {"model": "m", "messages": ASK, "max_tokens": 400}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


@needs_routers
@pytest.mark.timeout(400)
def test_the_decode_answers_from_the_prefilled_state(pd_vllm: Any) -> None:
    url, prefill, _ = pd_vllm()
    reply = _chat(url)
    assert reply.status_code == 200, reply.text
    answer = reply.json()["choices"][0]["message"]["content"]
    assert all(value in answer for value in RIGHT), answer
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in prefill.text()  # the router went through the prefill


@needs_routers
@pytest.mark.timeout(400)
def test_a_zeroed_kda_state_answers_fluently_and_wrongly(pd_vllm: Any) -> None:
    url, _, _ = pd_vllm(prefill_fault="transfer_kda_zeroed")
    reply = _chat(url)
    assert reply.status_code == 200, reply.text
    answer = reply.json()["choices"][0]["message"]["content"]
    assert "The access code of room-3 is" in answer and not any(value in answer for value in RIGHT), answer


@needs_routers
@pytest.mark.timeout(400)
@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_prefill_and_decode_tp_differ(pd_vllm: Any, policy: str) -> None:
    url, _, decode = pd_vllm(decode_tp=2, policy=policy)
    reply = _chat(url)
    if policy == "fail":
        assert reply.status_code == 500 and "Internal server error" in reply.text, reply.text
        decode.wait_for("failed with an internal error during generation", 30)
    else:  # the decode recomputes the prompt itself: right, only slower
        assert reply.status_code == 200, reply.text
        assert all(value in reply.json()["choices"][0]["message"]["content"] for value in RIGHT)
        decode.wait_for("recomputing its prompt", 30)
