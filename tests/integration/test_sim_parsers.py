"""vLLM's surface on two stand-in nodes (data-parallel form, headless worker), and what each missing
parser/cache flag changes, on single-node SGLang and vLLM stand-ins."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import NodeSet, SimNode, node_env, node_ip
from tests.ports import free_ports
from tests.sim_requests import LONG_QUESTION, TOOLS

pytestmark = pytest.mark.integration  # Gloo rendezvous between stand-in processes
# Each test's bound, the module fixture's start-up (4 stand-ins importing torch on 2 busy cores) included.
BOUND_S = 300

VLLM_FULL = [
    "--max-model-len",
    "32768",
    "--max-num-seqs",
    "16",
    "--gpu-memory-utilization",
    "0.92",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--reasoning-parser",
    "kimi_k3",
    "--tool-call-parser",
    "kimi_k3",
    "--enable-auto-tool-choice",
    "--served-model-name",
    "kimi-k3",
]


@dataclass
class Nodes:
    vllm_head: SimNode
    vllm_worker: SimNode
    vllm_port: int
    sglang_bare: SimNode
    sglang_bare_port: int
    vllm_bare: SimNode
    vllm_bare_port: int
    model: Path


def client(port: int, host: str = "127.0.0.1") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="none", timeout=30, max_retries=0)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    model = tmp_path_factory.mktemp("kimi-k3-tiny")
    write_checkpoint(model)
    rpc, vllm_port, sglang_bare_port, vllm_bare_port = free_ports(4)
    with NodeSet(tmp_path_factory.mktemp("logs")) as ns:
        for rank in range(2):
            argv = [
                "--mimic",
                "vllm",
                str(model),
                "-tp",
                "1",
                "-dp",
                "2",
                "-dpl",
                "1",
                "-dpr",
                str(rank),
                "-dpa",
                node_ip(0),
                "-dpp",
                str(rpc),
                "--host",
                "0.0.0.0",
                "--port",
                str(vllm_port),
                *VLLM_FULL,
            ]
            ns.start(
                f"vllm{rank}",
                argv + (["--headless"] if rank else []),
                node_env("vllm", rank, VLLM_ENGINE_READY_TIMEOUT_S="60", K3SIM_GROUP="gloo"),
            )
        # Single nodes on 127.0.0.5/6 with the parser and cache flags left out.
        sglang_bare = ns.start(
            "sglang-bare",
            [
                "--mimic",
                "sglang",
                str(model),
                "--host",
                "0.0.0.0",
                "--port",
                str(sglang_bare_port),
                "--context-length",
                "32768",
            ],
            {"SGLANG_HOST_IP": "127.0.0.5", "GLOO_SOCKET_IFNAME": "lo"},
        )
        vllm_bare = ns.start(
            "vllm-bare",
            [
                "--mimic",
                "vllm",
                str(model),
                "--port",
                str(vllm_bare_port),
                "--max-model-len",
                "32768",
                "--enable-prompt-tokens-details",
            ],
            {"VLLM_HOST_IP": "127.0.0.6", "GLOO_SOCKET_IFNAME": "lo"},
        )
        # Each node's own last start-up line: the head serves only once the headless worker has loaded
        # (and that worker logs nothing after its KV cache line); one pattern for all would let the head
        # pass on its KV cache line, before its server is up.
        for node, last_line in zip(ns.nodes, ("Application startup complete", "GPU KV cache size",
                                              "fired up and ready", "Application startup complete")):
            node.wait_for(last_line, 120)
        yield Nodes(
            ns.nodes[0],
            ns.nodes[1],
            vllm_port,
            sglang_bare,
            sglang_bare_port,
            vllm_bare,
            vllm_bare_port,
            model,
        )


@pytest.mark.timeout(BOUND_S)
def test_vllm_data_parallel_nodes_rendezvous(nodes: Nodes) -> None:
    for rank, node in enumerate((nodes.vllm_head, nodes.vllm_worker)):
        log = node.text()
        assert "gloo group up at tcp://127.0.0.1:" in log and f"node_rank={rank}, all_reduce sum=3" in log
        assert re.search(
            r"\(EngineCore_DP\d pid=\d+\) INFO \d\d-\d\d [\d:]+ \[parallel_state\.py:\d+\] world_size=2 "
            rf"rank={rank} local_rank=0 distributed_init_method=tcp://127\.0\.0\.1:\d+ backend=gloo",
            log,
        )
        assert "Using 'FLASHINFER_TRTLLM_MXFP4_BF16' Mxfp4 MoE backend." in log
        assert re.search(
            r"GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 32,768 tokens per request: ", log
        )
    assert (
        "Launching 1 data parallel engine(s) in headless mode, with head node address 127.0.0.1."
        in nodes.vllm_worker.text()
    )
    assert "Starting vLLM server on http://127.0.0.1:" in nodes.vllm_head.text()


@pytest.mark.timeout(BOUND_S)
def test_vllm_headless_node_serves_no_http(nodes: Nodes) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{node_ip(1)}:{nodes.vllm_port}/health", timeout=3)
    url = f"http://127.0.0.1:{nodes.vllm_port}"
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{url}/version", timeout=5).json() == {"version": "0.33.0"}
    assert httpx.get(f"{url}/server_info", timeout=5).status_code == 404  # only with VLLM_SERVER_DEV_MODE=1
    assert [m.id for m in client(nodes.vllm_port).models.list().data] == ["kimi-k3"]


@pytest.mark.timeout(BOUND_S)
def test_vllm_reasoning_tools_cache_and_metrics(nodes: Nodes) -> None:
    c = client(nodes.vllm_port)
    reply = c.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Why?"}])
    msg = reply.choices[0].message
    assert getattr(msg, "reasoning", "").startswith("The user asks: Why?")
    assert getattr(msg, "reasoning_content", None) is None and "<|open|>" not in (msg.content or "")
    call = c.chat.completions.create(
        model="kimi-k3",
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "get_weather in Oslo"}],
    )
    assert call.choices[0].finish_reason == "tool_calls"
    assert call.choices[0].message.tool_calls
    first_call = call.choices[0].message.tool_calls[0]
    assert (
        isinstance(first_call, ChatCompletionMessageFunctionToolCall)
        and first_call.function.name == "get_weather"
    )
    turn1 = [{"role": "user", "content": LONG_QUESTION}]
    first = c.chat.completions.create(model="kimi-k3", messages=turn1)  # type: ignore[arg-type]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "?"},
    ]
    second = c.chat.completions.create(model="kimi-k3", messages=turn2)  # type: ignore[arg-type]
    assert second.usage and second.usage.prompt_tokens_details
    assert second.usage.prompt_tokens_details.cached_tokens == 1024
    text = httpx.get(f"http://127.0.0.1:{nodes.vllm_port}/metrics", timeout=5).text
    assert re.search(
        r'^vllm:prefix_cache_hits_total\{engine="0",model_name="kimi-k3"\} 1024\.0$', text, re.MULTILINE
    )
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert f"\n{name}{{" in text


@pytest.mark.timeout(BOUND_S)
def test_sglang_without_parsers_cache_report_or_metrics(nodes: Nodes) -> None:
    c = client(nodes.sglang_bare_port, "127.0.0.5")
    reply = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Why?"}])
    msg = reply.choices[0].message
    assert (
        msg.content
        and msg.content.startswith("<|open|>think<|sep|>")
        and "<|close|>think<|sep|>" in msg.content
    )
    assert getattr(msg, "reasoning_content", None) is None
    assert reply.usage and reply.usage.prompt_tokens_details is None  # no --enable-cache-report
    tools = c.chat.completions.create(
        model="x",
        tools=TOOLS,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "get_weather in Oslo"}],
    )
    assert tools.choices[0].finish_reason == "stop" and not tools.choices[0].message.tool_calls
    assert "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0" in (
        tools.choices[0].message.content or ""
    )
    assert httpx.get(f"http://127.0.0.5:{nodes.sglang_bare_port}/metrics", timeout=5).status_code == 404


@pytest.mark.timeout(BOUND_S)
def test_vllm_without_parsers_auto_tool_choice_or_prefix_caching(nodes: Nodes) -> None:
    c = client(nodes.vllm_bare_port, "127.0.0.6")
    model = str(nodes.model)
    msg = (
        c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Why?"}])
        .choices[0]
        .message
    )
    assert (
        msg.content
        and msg.content.startswith("<|open|>think<|sep|>")
        and getattr(msg, "reasoning", None) is None
    )
    with pytest.raises(openai.BadRequestError, match='"auto" tool choice requires --enable-auto-tool-choice'):
        c.chat.completions.create(
            model=model,
            tools=TOOLS,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "get_weather in Oslo"}],
        )
    turn1 = [{"role": "user", "content": LONG_QUESTION}]
    first = c.chat.completions.create(model=model, messages=turn1)  # type: ignore[arg-type]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "?"},
    ]
    second = c.chat.completions.create(model=model, messages=turn2)  # type: ignore[arg-type]
    assert second.usage and second.usage.prompt_tokens_details
    assert second.usage.prompt_tokens_details.cached_tokens == 0  # K3 on vLLM needs --enable-prefix-caching


@pytest.mark.timeout(BOUND_S)
def test_vllm_head_reports_a_dead_worker(nodes: Nodes) -> None:
    assert all(n.popen.poll() is None for n in (nodes.vllm_head, nodes.sglang_bare, nodes.vllm_bare))
    nodes.vllm_worker.kill()
    # Usually Gloo reports the closed connection at once; under load the head may instead notice the
    # silence after WORKER_SILENCE_S, with a timeout as the cause. Either way it must say which node died.
    nodes.vllm_head.wait_for(r"k3sim: lost node rank 1 \(", 90)
    # As real vLLM (tests/realengine/test_health_peer_gone.py): /health stays 200 until a request finds the
    # peer gone; that request fails 500, the engine's lines name the closed Gloo connection, and it exits 0.
    assert httpx.get(f"http://127.0.0.1:{nodes.vllm_port}/health", timeout=5).status_code == 200
    with pytest.raises(openai.InternalServerError, match="EngineCore encountered an issue"):
        client(nodes.vllm_port).chat.completions.create(
            model="kimi-k3", messages=[{"role": "user", "content": "hi"}]
        )
    assert nodes.vllm_head.wait_exit(60) == 0
    text = nodes.vllm_head.text()
    lost = re.search(r"k3sim: lost node rank 1 \((\w+): (.+?)\); as vLLM", text)
    assert lost, text
    # Gloo's closed connection, or under load the heartbeat's timeout (CI saw it): vLLM's line quotes it alone.
    assert f"RuntimeError: Worker failed with error '{lost[2]}'" in text, text
