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

from k3deploy.sim.local_nodes import NodeSet, SimNode
from tests.integration.test_sim_pd import FACTS, QUESTION, RIGHT, VENV, needs_routers
from tests.ports import free_ports

pytestmark = pytest.mark.integration
PREFILL_IP, DECODE_IP = "127.0.0.41", "127.0.0.42"
FLAGS = ["--max-model-len", "32768", "--served-model-name", "m", "--reasoning-parser", "kimi_k3",
         "--enable-prompt-tokens-details", "--enable-prefix-caching"]
ASK: Any = [{"role": "user", "content": f"{FACTS} {QUESTION}"}]


@pytest.fixture
def pd_vllm(checkpoint: Path, tmp_path: Path) -> Iterator[Any]:
    """A factory: (router URL, prefill, decode, their API port) for a prefill fault, the decode's TP and
    failure policy."""
    routers: list[subprocess.Popen[bytes]] = []
    with NodeSet(tmp_path / "logs") as ns:

        def start(prefill_fault: str = "", decode_tp: int = 1,
                  policy: str = "fail") -> tuple[str, SimNode, SimNode, int]:
            api, side_p, side_d, router_port, metrics = free_ports(5)
            config = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                 "kv_load_failure_policy": policy})
            base = ["--mimic", "vllm", str(checkpoint), "--host", "0.0.0.0", "--port", str(api), *FLAGS,
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
            return f"http://127.0.0.1:{router_port}", prefill, decode, api

        yield start
        for router in routers:
            if router.poll() is None:
                os.killpg(router.pid, signal.SIGKILL)
            router.wait(timeout=30)


def _chat(url: str, messages: Any = ASK, **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": 400, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def _hits(url: str) -> float:
    """The server's own prefix-cache hits (vLLM's counter on its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits"))


@needs_routers
@pytest.mark.timeout(400)
def test_the_decode_answers_from_the_prefilled_state(pd_vllm: Any) -> None:
    url, prefill, _, _ = pd_vllm()
    reply = _chat(url)
    assert reply.status_code == 200, reply.text
    answer = reply.json()["choices"][0]["message"]["content"]
    assert all(value in answer for value in RIGHT), answer
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in prefill.text()  # the router went through the prefill


@needs_routers
@pytest.mark.timeout(400)
def test_a_zeroed_kda_state_answers_fluently_and_wrongly(pd_vllm: Any) -> None:
    url, _, _, _ = pd_vllm(prefill_fault="transfer_kda_zeroed")
    reply = _chat(url)
    assert reply.status_code == 200, reply.text
    answer = reply.json()["choices"][0]["message"]["content"]
    assert "The access code of room-3 is" in answer and not any(value in answer for value in RIGHT), answer


@needs_routers
@pytest.mark.timeout(400)
@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_prefill_and_decode_tp_differ(pd_vllm: Any, policy: str) -> None:
    url, _, decode, _ = pd_vllm(decode_tp=2, policy=policy)
    reply = _chat(url)
    if policy == "fail":
        assert reply.status_code == 500 and "Internal server error" in reply.text, reply.text
        decode.wait_for("failed with an internal error during generation", 30)
    else:  # the decode recomputes the prompt itself: right, only slower
        assert reply.status_code == 200, reply.text
        assert all(value in reply.json()["choices"][0]["message"]["content"] for value in RIGHT)
        decode.wait_for("recomputing its prompt", 30)


@needs_routers
@pytest.mark.timeout(400)
def test_through_the_router_usage_says_the_prefills_hit(pd_vllm: Any) -> None:
    """What a client of vllm-router 0.1.17 sees: cached_tokens is the prefill's hit, not the decode's (whose
    own prefix cache still hits); a salted resend hits nothing."""
    url, _, _, api = pd_vllm()
    prefill, decode = f"http://{PREFILL_IP}:{api}", f"http://{DECODE_IP}:{api}"
    assert _chat(decode).status_code == 200  # the decode alone computes (and caches) the prompt

    def routed(**extra: Any) -> tuple[int, dict[str, float]]:
        before = {u: _hits(u) for u in (prefill, decode)}
        reply = _chat(url, **extra)
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"], {
            u: _hits(u) - before[u] for u in (prefill, decode)}

    cached, grown = routed()  # the prefill misses, the decode hits its own cache: usage says the prefill's 0
    assert cached == 0 == grown[prefill] and grown[decode] > 0, (cached, grown)
    cached, grown = routed()  # now the prefill hits too
    assert cached > 0 and cached == grown[prefill], (cached, grown)
    cached, grown = routed(cache_salt="cold")
    assert cached == 0, (cached, grown)


@needs_routers
@pytest.mark.timeout(400)
def test_the_decode_reports_the_prefills_hit(pd_vllm: Any) -> None:
    """vLLM 0.32.0's contract, asked of each server as the router asks: the prefill returns its own
    prefix-cache hit in kv_transfer_params (remote_prefill_cached_tokens, v1/core/sched/scheduler.py) and the
    decode reports that as cached_tokens, not its own hit (v1/engine/output_processor.py)."""
    _, _, _, api = pd_vllm()
    prefill, decode = f"http://{PREFILL_IP}:{api}", f"http://{DECODE_IP}:{api}"
    assert _chat(decode).status_code == 200  # the decode alone computes (and caches) the prompt
    for want_hit in (False, True):  # the prefill misses, then hits
        first = _chat(prefill, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        assert first.status_code == 200, first.text
        params = first.json()["kv_transfer_params"]
        assert (params["remote_prefill_cached_tokens"] > 0) is want_hit, params
        before = _hits(decode)
        second = _chat(decode, kv_transfer_params=params)
        assert second.status_code == 200, second.text
        assert _hits(decode) > before  # its own cache hit all along
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == params["remote_prefill_cached_tokens"], (cached, params)
