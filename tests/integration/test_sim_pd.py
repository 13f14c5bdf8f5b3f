"""The real router (smg) in PD mode in front of a stand-in SGLang prefill and decode: the completion goes
through both, the decode reads the prefill's KV and KDA state over its bootstrap server (retrieval at depth
works), its radix cache hits on turn 2; and each transfer fault shows its real symptom."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3deploy.sim.local_nodes import NodeSet, SimNode
from tests.ports import free_ports

pytestmark = pytest.mark.integration
VENV = Path(os.environ.get("K3DEPLOY_ROUTERS_VENV") or Path.home() / ".cache" / "k3deploy" / "routers")
needs_routers = pytest.mark.skipif(not (VENV / ".k3deploy-routers-ready").is_file(),
                                   reason=f"no routers venv at {VENV} (scripts/routers_venv.sh makes it)")
PREFILL_IP, DECODE_IP, DECODE2_IP = "127.0.0.31", "127.0.0.32", "127.0.0.33"
FLAGS = ["--context-length", "32768", "--enable-cache-report", "--served-model-name", "m", "--reasoning-parser", "kimi_k3",
         "--disaggregation-transfer-backend", "mooncake"]
# Facts spread through a long context; the question asks the ones stated deepest.
FILLER = " ".join(f"note{i % 89}" for i in range(1500))
FACTS = "The access code of room-3 is Q7X-41. " + FILLER + " The access code of room-9 is ZK4-77. " + FILLER
QUESTION = "What is the access code of room-3? What is the access code of room-9?"
RIGHT = ("Q7X-41", "ZK4-77")


@dataclass
class Pd:
    url: str
    prefill: SimNode
    decode: SimNode
    router: subprocess.Popen[bytes]
    router_log: Path
    decodes: list[SimNode]

    def chat(self, messages: list[dict[str, Any]], timeout_s: float = 120) -> httpx.Response:
        body = {"model": "m", "messages": messages, "max_tokens": 400}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=timeout_s)


@pytest.fixture
def pd_pair(checkpoint: Path, tmp_path: Path) -> Iterator[Any]:
    """A factory: start prefill, decode and smg --pd-disaggregation (faults, the port the router is told)."""
    started: list[subprocess.Popen[bytes]] = []
    with NodeSet(tmp_path / "logs") as ns:

        def start(prefill_fault: str = "", router_bootstrap_port: int | None = None, decodes: int = 1) -> Pd:
            api, boot, router_port, metrics_port = free_ports(4)
            env = {"K3SIM_SPEED": "50", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "8",
                   "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "20"}
            common = ["--mimic", "sglang", str(checkpoint), "--host", "0.0.0.0", "--port", str(api), *FLAGS,
                      "--disaggregation-bootstrap-port", str(boot)]
            prefill = ns.start("prefill", [*common, "--disaggregation-mode", "prefill"],
                               {**env, "SGLANG_HOST_IP": PREFILL_IP, "K3SIM_FAULT": prefill_fault})
            ips = (DECODE_IP, DECODE2_IP)[:decodes]
            decode_nodes = [ns.start(f"decode{i}", [*common, "--disaggregation-mode", "decode",
                                                    "--disaggregation-decode-enable-radix-cache"],
                                     {**env, "SGLANG_HOST_IP": ip}) for i, ip in enumerate(ips)]
            for node in (prefill, *decode_nodes):
                node.wait_for("fired up and ready", 120)
            log = tmp_path / "router.log"
            argv = [str(VENV / "bin" / "python"), "-m", "smg.launch_router", "--host", "127.0.0.1",
                    "--port", str(router_port), "--pd-disaggregation",
                    "--prefill", f"http://{PREFILL_IP}:{api}", str(router_bootstrap_port or boot),
                    *(a for ip in ips for a in ("--decode", f"http://{ip}:{api}")), "--policy", "random",
                    # the router's metrics port is fixed (29000) by default: others' routers may hold it
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
            with log.open("wb") as out:
                router = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            started.append(router)
            pd = Pd(f"http://127.0.0.1:{router_port}", prefill, decode_nodes[0], router, log, decode_nodes)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # ready: the router lists both workers healthy
                try:
                    workers = httpx.get(f"{pd.url}/workers", timeout=5).json().get("workers", [])
                    if len(workers) == 1 + decodes and all(w.get("is_healthy") for w in workers):
                        return pd
                except (httpx.HTTPError, ValueError):
                    pass
                assert router.poll() is None, log.read_text()
                time.sleep(0.5)
            raise AssertionError(f"router never listed every worker healthy:\n{log.read_text()[-3000:]}")

        yield start
        for router in started:
            if router.poll() is None:
                os.killpg(router.pid, signal.SIGKILL)
            router.wait(timeout=30)


def _answer(reply: httpx.Response) -> str:
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


@needs_routers
@pytest.mark.timeout(400)
def test_a_text_completion_through_the_router_is_prefilled_once_and_decoded_from_the_state(pd_pair: Any) -> None:
    """smg routes /v1/completions in PD mode to both roles with the bootstrap fields, as it does a chat: the
    prefill computes the prompt, the decode generates from what it fetched (no prefill batch of its own); streamed
    and not, through one pair (each prompt opens differently, so the second shares no cached prefix)."""
    pd = pd_pair()
    for n, stream in enumerate((False, True)):
        body = {"model": "m", "prompt": f"Request {n}. {FACTS} {QUESTION}", "max_tokens": 8, "stream": stream}
        reply = httpx.post(f"{pd.url}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert ("data: " in reply.text) if stream else reply.json()["choices"][0]["text"], reply.text
        # the (n+1)-th prefill batch: this request's
        room = pd.prefill.wait_for(rf"(?s)(?:Prefill batch.*?){{{n}}}Prefill batch. #new-seq: 1, #new-token: (\d+)", 30)
        assert int(room.group(1)) > 3000, stream
        assert "Prefill batch" not in pd.decode.text(), stream


@needs_routers
@pytest.mark.timeout(400)
def test_completion_through_the_router_uses_the_prefilled_state_and_hits_on_turn_two(pd_pair: Any) -> None:
    pd = pd_pair()
    turn1 = [{"role": "user", "content": f"{FACTS} {QUESTION}"}]
    first = pd.chat(turn1)
    answer = _answer(first)
    assert all(value in answer for value in RIGHT), answer
    room = pd.prefill.wait_for(r"Prefill batch. #new-seq: 1, #new-token: (\d+)", 30)
    assert int(room.group(1)) > 3000  # the prefill computed the long prompt ...
    assert "Prefill batch" not in pd.decode.text()  # ... and the decode generated from the state it received
    turn2 = [*turn1, first.json()["choices"][0]["message"], {"role": "user", "content": QUESTION}]
    second = pd.chat(turn2)
    assert all(value in _answer(second) for value in RIGHT)
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, second.json()["usage"]


@needs_routers
@pytest.mark.timeout(400)
@pytest.mark.parametrize("fault", ["transfer_kda_zeroed", "transfer_kda_dropped"])
def test_a_lost_kda_state_answers_fluently_and_wrongly(pd_pair: Any, fault: str) -> None:
    pd = pd_pair(prefill_fault=fault)
    answer = _answer(pd.chat([{"role": "user", "content": f"{FACTS} {QUESTION}"}]))
    assert "The access code of room-3 is" in answer and "The access code of room-9 is" in answer
    assert not any(value in answer for value in RIGHT), answer
    assert "KVTransferError" not in pd.decode.text() + pd.prefill.text()


@needs_routers
@pytest.mark.timeout(400)
def test_a_bootstrap_port_mismatch_fails_every_request_at_the_decode(pd_pair: Any) -> None:
    wrong = free_ports(1)[0]
    pd = pd_pair(router_bootstrap_port=wrong)  # both workers register: the router never checks the port
    reply = pd.chat([{"role": "user", "content": QUESTION}])
    assert reply.status_code >= 500, reply.text
    assert f"Could not fetch prefill parallel info from bootstrap_addr: {PREFILL_IP}:{wrong}" in reply.text
    pd.decode.wait_for("Decode transfer failed for request", 30)
    pd.prefill.wait_for(r"Prefill bootstrap failed for request .* timed out after 8s in KVPoll.Bootstrapping", 60)


@needs_routers
@pytest.mark.timeout(400)
def test_a_prefill_dying_mid_transfer_fails_the_request(pd_pair: Any) -> None:
    pd = pd_pair(prefill_fault="prefill_dies_mid_transfer")
    reply = pd.chat([{"role": "user", "content": f"{FACTS} {QUESTION}"}])
    assert reply.status_code >= 500, reply.text
    assert pd.prefill.wait_exit(30) != 0
    pd.decode.wait_for("Failed to get kvcache from prefill instance, it might be dead", 30)


@needs_routers
@pytest.mark.timeout(400)
def test_one_prefill_two_decodes_each_gets_its_own_room(pd_pair: Any) -> None:
    pd = pd_pair(decodes=2)
    # Concurrent requests with different facts: a state handed to the wrong room answers another's codes. The router's
    # policy is random, so six requests all land on one decode once in 32 runs: rounds of six go on until both decodes
    # have served (all on one decode after 5 rounds: once in 32^5, or a router that does not spread them).
    sent, served = 0, [0, 0]
    for round_ in range(5):
        codes = [f"C{i}A-{round_}{i}{i}" for i in range(6)]
        prompts = [f"The access code of room-{i} is {code}. {FILLER} What is the access code of room-{i}?"
                   for i, code in enumerate(codes)]
        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(lambda text: _answer(pd.chat([{"role": "user", "content": text}])), prompts))
        for code, answer in zip(codes, answers, strict=True):
            assert code in answer, answer
        sent += len(prompts)
        served = [node.text().count('"POST /v1/chat/completions HTTP/1.1" 200') for node in pd.decodes]
        if all(served):
            break
    assert sum(served) == sent and all(served), served  # every request decoded once, both decodes took some
