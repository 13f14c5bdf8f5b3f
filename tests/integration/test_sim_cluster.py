"""Four stand-in SGLang nodes on 127.0.0.1..4: Gloo rendezvous, the head's OpenAI API, workers' dummy /health,
and the workers' exit when the head is killed (the last test: it ends the module's cluster)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import NodeSet, node_env, node_ip, sglang_node_argv
from tests.ports import free_ports
from tests.sim_requests import LONG_QUESTION, TOOLS

pytestmark = pytest.mark.integration  # Gloo rendezvous between stand-in processes

NNODES = 4
FLAGS = [
    "--context-length",
    "32768",
    "--max-running-requests",
    "16",
    "--mem-fraction-static",
    "0.85",
    "--kv-cache-dtype",
    "bf16",
    "--mamba-ssm-dtype",
    "float32",
    "--reasoning-parser",
    "kimi_k3",
    "--tool-call-parser",
    "kimi_k3",
    "--enable-cache-report",
    "--enable-metrics",
]


@dataclass
class Cluster:
    nodes: NodeSet
    model: Path
    port: int
    dist_port: int
    ready_s: float

    @property
    def url(self) -> str:
        return f"http://{node_ip(0)}:{self.port}"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", timeout=30, max_retries=0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = tmp_path_factory.mktemp("kimi-k3-tiny")
    write_checkpoint(model)
    dist_port, http_port = free_ports(2)
    with NodeSet(tmp_path_factory.mktemp("logs")) as nodes:
        started = time.monotonic()
        for rank in range(NNODES):  # all at once: each spends ~2 s CPU importing torch
            argv = sglang_node_argv(
                model,
                rank=rank,
                nnodes=NNODES,
                dist_port=dist_port,
                http_port=http_port,
                timeout_s=60,
                extra=FLAGS,
            )
            nodes.start(f"node{rank}", argv, node_env("sglang", rank, K3SIM_GROUP="gloo"))
        nodes.nodes[0].wait_for(r"The server is fired up and ready to roll!", 90)
        ready_s = time.monotonic() - started
        for worker in nodes.nodes[1:]:
            worker.wait_for(r"Dummy health check server started", 30)
        yield Cluster(nodes=nodes, model=model, port=http_port, dist_port=dist_port, ready_s=ready_s)


@pytest.mark.timeout(120)
def test_four_ranks_rendezvous_over_gloo(cluster: Cluster) -> None:
    print(f"4 ranks ready in {cluster.ready_s:.1f} s")
    for rank, node in enumerate(cluster.nodes.nodes):
        log = node.text()
        assert f"torch.distributed gloo group up at tcp://127.0.0.1:{cluster.dist_port}: world_size=4 " in log
        assert f"node_rank={rank}, all_reduce sum=10 as expected" in log
        assert re.search(
            rf"\[[\d :-]+ DP0 PP0 TP{rank} EP{rank}\] Init parallel ends\. elapsed=\d+\.\d\d s", log
        )
        assert (
            "Kimi-K3 on SM100/SM103/SM107: moe_runner_backend=flashinfer_mxfp4 (FlashInfer SiTU kernels)."
            in log
        )
        assert re.search(
            r"Load weight end\. elapsed=\d+\.\d\d s, type=KimiK3ForConditionalGeneration, avail mem=", log
        )
        assert re.search(r"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, KV size: ", log)
        assert "Mamba Cache is allocated. max_mamba_cache_size: " in log
        assert re.search(
            r"max_total_num_tokens=\d+, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            r"max_running_requests=16, context_len=32768, available_gpu_mem=",
            log,
        )
        assert node.popen.poll() is None


@pytest.mark.timeout(60)
def test_workers_serve_only_a_dummy_health(cluster: Cluster) -> None:
    for rank in range(1, NNODES):
        url = f"http://{node_ip(rank)}:{cluster.port}"
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 404
        assert f"at {node_ip(rank)}:{cluster.port}" in cluster.nodes.nodes[rank].text()


@pytest.mark.timeout(60)
def test_head_routes(cluster: Cluster) -> None:
    assert httpx.get(f"{cluster.url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{cluster.url}/health_generate", timeout=5).status_code == 200
    models = cluster.client().models.list()
    assert [m.id for m in models.data] == [str(cluster.model)]  # no --served-model-name: the path
    info = httpx.get(f"{cluster.url}/server_info", timeout=5).json()
    assert info["version"] == "0.5.23" and info["tp_size"] == 4 and info["nnodes"] == 4
    assert info["moe_runner_backend"] == "flashinfer_mxfp4"


@pytest.mark.timeout(60)
def test_reasoning_is_split_into_reasoning_content(cluster: Cluster) -> None:
    reply = cluster.client().chat.completions.create(
        model="kimi-k3",
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
        extra_body={"reasoning_effort": "low"},
    )
    msg = reply.choices[0].message
    assert getattr(msg, "reasoning_content", "").startswith("The user asks: Why is the sky blue?")
    assert msg.content and "<|open|>think" not in msg.content and "<|close|>think" not in msg.content
    usage = reply.usage
    assert usage is not None and usage.completion_tokens_details is not None
    reasoning = usage.completion_tokens_details.reasoning_tokens or 0
    assert reasoning / usage.completion_tokens > 0.8


@pytest.mark.timeout(60)
def test_tool_calls_come_back_structured(cluster: Cluster) -> None:
    reply = cluster.client().chat.completions.create(
        model="kimi-k3",
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "Use get_weather to check Berlin"}],
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall) and call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Berlin"}'


@pytest.mark.timeout(60)
def test_second_turn_hits_the_prefix_cache(cluster: Cluster) -> None:
    client = cluster.client()
    turn1 = [{"role": "user", "content": LONG_QUESTION}]
    first = client.chat.completions.create(model="kimi-k3", messages=turn1)  # type: ignore[arg-type]
    assert first.usage and first.usage.prompt_tokens_details
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = [
        *turn1,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Shorter, please."},
    ]
    second = client.chat.completions.create(model="kimi-k3", messages=turn2)  # type: ignore[arg-type]
    assert second.usage and second.usage.prompt_tokens_details
    assert second.usage.prompt_tokens_details.cached_tokens == 1024
    assert "#cached-token: 1024" in cluster.nodes.nodes[0].text()


@pytest.mark.timeout(60)
def test_streaming_with_usage(cluster: Cluster) -> None:
    stream = cluster.client().chat.completions.create(
        model="kimi-k3",
        messages=[{"role": "user", "content": "Count to three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert reasoning.startswith("The user asks: Count to three") and content.startswith("Stand-in answer:")
    assert usage is not None and usage.total_tokens > usage.prompt_tokens


@pytest.mark.timeout(60)
def test_request_longer_than_the_context_is_rejected(cluster: Cluster) -> None:
    with pytest.raises(openai.BadRequestError, match=r"exceeds the maximum allowed length \(32767 tokens\)"):
        cluster.client().chat.completions.create(
            model="kimi-k3", messages=[{"role": "user", "content": "w " * 33000}]
        )


@pytest.mark.timeout(60)
def test_metrics_count_what_was_served(cluster: Cluster) -> None:
    cluster.client().chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}])
    text = httpx.get(f"{cluster.url}/metrics", timeout=5).text
    values = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(sglang:\w+)\{[^}]*\} (\S+)$", text, re.MULTILINE)
    }
    assert values["sglang:prompt_tokens_total"] > 0 and values["sglang:generation_tokens_total"] > 0
    assert values["sglang:cached_tokens_total"] >= 1024 and 0 < values["sglang:cache_hit_rate"] < 1
    assert values["sglang:num_running_reqs"] == 0 and values["sglang:num_queue_reqs"] == 0
    assert {"sglang:token_usage", "sglang:mamba_usage"} <= set(values)


@pytest.mark.timeout(60)
def test_worker_death_is_logged_while_the_head_keeps_its_health(cluster: Cluster) -> None:
    head = cluster.nodes.nodes[0]
    cluster.nodes.nodes[3].kill()
    head.wait_for(
        r"Lost node rank 3: RuntimeError: Connection closed by peer .*The scheduler is stuck in a "
        r"collective",
        15,
    )
    # As SGLang's head: /health still answers, generation never finishes (the supervisor stops the group).
    assert httpx.get(f"{cluster.url}/health", timeout=5).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{cluster.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            timeout=2,
        )


@pytest.mark.timeout(60)
def test_killing_the_head_makes_the_workers_exit(cluster: Cluster) -> None:
    head, workers = cluster.nodes.nodes[0], cluster.nodes.nodes[1:3]  # node 3 was killed above
    head.kill()
    killed = time.monotonic()
    for worker in workers:
        assert worker.wait_exit(60) == 1  # bounded (they would otherwise wait forever for their head)
        assert "Lost the head node (tcp://127.0.0.1:" in worker.text()
    print(f"workers exited {time.monotonic() - killed:.2f} s after the head was killed")
