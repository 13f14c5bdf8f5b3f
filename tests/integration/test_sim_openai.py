"""The official openai client against both mimics over HTTP: streams that never break, one token per chunk,
the right finish_reason and usage, the rest of the API surface clients use, and /metrics that parses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.generation import complete
from k3deploy.sim.local_nodes import NodeSet
from k3deploy.sim.tokens import THINK_OPEN, tokenize
from tests.ports import free_ports
from tests.sim_requests import LONG_QUESTION, TOOLS

pytestmark = pytest.mark.integration
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]  # Any: the client's TypedDicts
TOOLS_ANY: Any = TOOLS
FLAGS = {
    "sglang": [
        "--context-length", "32768", "--reasoning-parser", "kimi_k3", "--tool-call-parser", "kimi_k3",
        "--enable-cache-report", "--enable-metrics", "--served-model-name", "m",
    ],
    "vllm": [
        "--max-model-len", "32768", "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--reasoning-parser", "kimi_k3", "--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice", "--served-model-name", "m",
    ],
}  # fmt: skip
REASONING_KEY = {"sglang": "reasoning_content", "vllm": "reasoning"}


@dataclass(frozen=True)
class Engine:
    mimic: str
    url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    model = tmp_path_factory.mktemp("kimi-k3-tiny")
    write_checkpoint(model)
    ports = dict(zip(("sglang", "vllm"), free_ports(2), strict=True))
    env = {"GLOO_SOCKET_IFNAME": "lo", "K3SIM_SPEED": "20", "VLLM_SERVER_DEV_MODE": "1"}
    with NodeSet(tmp_path_factory.mktemp("logs")) as ns:
        for n, (mimic, port) in enumerate(ports.items()):
            ip = f"127.0.0.{7 + n}"
            host_env = {"SGLANG_HOST_IP" if mimic == "sglang" else "VLLM_HOST_IP": ip}
            argv = ["--mimic", mimic, str(model), "--host", "0.0.0.0", "--port", str(port), *FLAGS[mimic]]
            ns.start(mimic, argv, {**env, **host_env})
        for node in ns.nodes:
            node.wait_for(r"Starting vLLM server on|fired up and ready", 90)
        yield {m: Engine(m, f"http://127.0.0.{7 + n}:{p}") for n, (m, p) in enumerate(ports.items())}


def streamed(engine: Engine, **kwargs: Any) -> tuple[list[Any], Any]:
    """(chunks with choices, the usage chunk) of one streamed chat request."""
    stream = engine.client().chat.completions.create(
        model="m", stream=True, stream_options={"include_usage": True}, **kwargs
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    return chunks[:-1], chunks[-1].usage


def delta_text(chunk: Any, key: str) -> str:
    delta = chunk.choices[0].delta
    calls = delta.tool_calls or []
    fragments = [c.function.arguments or "" for c in calls if c.function] + [c.id or "" for c in calls]
    return (delta.content or "") + ((delta.model_extra or {}).get(key) or "") + "".join(fragments)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
@pytest.mark.parametrize("max_tokens", [1, 16, 64, 300])
def test_every_length_completes_with_the_right_finish_and_usage(
    engines: dict[str, Engine], mimic: str, max_tokens: int
) -> None:
    engine, key = engines[mimic], REASONING_KEY[mimic]
    natural = complete(QUESTION, max_tokens=max_tokens)
    want = "length" if max_tokens < 300 else "stop"
    assert natural.finish_reason == want  # max effort thinks ~200 tokens: only 300 lets it finish
    reply = engine.client().chat.completions.create(model="m", messages=QUESTION, max_tokens=max_tokens)
    assert reply.choices[0].finish_reason == want
    assert reply.usage is not None and reply.usage.completion_tokens == natural.tokens
    message = reply.choices[0].message
    chunks, usage = streamed(engine, messages=QUESTION, max_tokens=max_tokens)
    assert usage.completion_tokens == natural.tokens and usage.prompt_tokens == reply.usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [want]
    # One token per chunk: every chunk with text carries exactly one token, and only the think markers
    # the reasoning parser swallows have no chunk of their own.
    texts = [t for t in (delta_text(c, key) for c in chunks) if t]
    assert all(len(tokenize(t)) == 1 for t in texts)
    markers = sum(1 for p in natural.pieces if p.kind == "think")
    assert len(texts) == natural.tokens - markers
    streamed_reasoning = "".join((c.choices[0].delta.model_extra or {}).get(key) or "" for c in chunks)
    assert streamed_reasoning == ((message.model_extra or {}).get(key) or "")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (message.content or "")
    if max_tokens < 300:
        assert message.content is None and THINK_OPEN not in ((message.model_extra or {}).get(key) or "")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_streamed_tool_call_arrives_as_index_id_name_then_arguments(
    engines: dict[str, Engine], mimic: str
) -> None:
    messages: Any = [{"role": "user", "content": "Call get_weather for Paris"}]
    chunks, usage = streamed(engines[mimic], messages=messages, tools=TOOLS, reasoning_effort="low")
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = calls[0], calls[1:]
    assert (first.index, first.id, first.type) == (0, "functions.get_weather:0", "function")
    assert first.function.name == "get_weather" and first.function.arguments == ""
    assert rest and all(c.index == 0 and c.id is None and c.function.name is None for c in rest)
    assert json.loads("".join(c.function.arguments for c in rest)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert usage.completion_tokens == complete(messages, tools=TOOLS, tool_choice="auto", effort="low").tokens
    reply = (
        engines[mimic]
        .client()
        .chat.completions.create(
            model="m",
            messages=messages,
            tools=TOOLS_ANY,
            reasoning_effort="low",
        )
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    structured: Any = reply.choices[0].message.tool_calls
    assert structured[0].function.arguments == '{"city": "Paris"}'


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_ignore_eos_min_tokens_and_both_ways_of_asking_for_effort(
    engines: dict[str, Engine], mimic: str
) -> None:
    client = engines[mimic].client()

    def tokens(**extra: Any) -> tuple[int, str | None]:
        reply = client.chat.completions.create(model="m", messages=QUESTION, extra_body=extra)
        assert reply.usage is not None
        return reply.usage.completion_tokens, reply.choices[0].finish_reason

    default = tokens()
    assert tokens(max_tokens=400, ignore_eos=True) == (400, "length")
    assert tokens(max_completion_tokens=300, min_tokens=250) == (250, "stop")
    low = tokens(reasoning_effort="low")
    assert tokens(chat_template_kwargs={"thinking": True, "thinking_effort": "low"}) == low
    assert low[0] < tokens(reasoning_effort="high")[0] < default[0] == tokens(reasoning_effort="max")[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_text_completions_stream_one_token_per_chunk(engines: dict[str, Engine], mimic: str) -> None:
    client = engines[mimic].client()
    whole = client.completions.create(model="m", prompt="Say something", max_tokens=40)
    assert whole.choices[0].finish_reason == "length" and whole.usage and whole.usage.completion_tokens == 40
    chunks = list(client.completions.create(model="m", prompt="Say something", max_tokens=40, stream=True))
    assert len(chunks) == 40 and all(len(tokenize(c.choices[0].text)) == 1 for c in chunks)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert whole.choices[0].text.startswith(THINK_OPEN)  # no parser runs on /v1/completions
    short = client.completions.create(model="m", prompt="Say something")
    assert short.usage and short.usage.completion_tokens == 16  # the API's default max_tokens


@pytest.mark.timeout(60)
def test_vllm_continuous_usage_and_tokenizer_endpoints(engines: dict[str, Engine]) -> None:
    vllm = engines["vllm"]
    stream = vllm.client().chat.completions.create(
        model="m",
        messages=QUESTION,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        # vLLM's extension of stream_options, which the client's types do not know
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    counts = [c.usage.completion_tokens for c in stream if c.choices and c.usage]
    assert counts == sorted(counts) and counts[-1] == 10 and counts[0] <= 1
    with httpx.Client(base_url=vllm.url, timeout=30) as http:
        tok = http.post("/tokenize", json={"prompt": "hello <|im_end|> world"}).json()
        assert tok["count"] == 3 and tok["max_model_len"] == 32768
        assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json() == {
            "prompt": "hello <|im_end|> world"
        }
        chat = http.post("/tokenize", json={"messages": QUESTION}).json()
        reply = vllm.client().chat.completions.create(model="m", messages=QUESTION, max_tokens=1)
        assert reply.usage is not None and chat["count"] == reply.usage.prompt_tokens
        assert http.post("/detokenize", json={"tokens": [12345]}).status_code == 400


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_flush_endpoint_empties_the_prefix_cache(engines: dict[str, Engine], mimic: str) -> None:
    engine = engines[mimic]
    client = engine.client()
    turn: Any = [{"role": "user", "content": LONG_QUESTION}]

    def cached() -> int:
        reply = client.chat.completions.create(model="m", messages=turn, max_tokens=2)
        details = reply.usage.prompt_tokens_details if reply.usage else None
        return details.cached_tokens or 0 if details else 0

    cached()
    assert cached() == 1024  # the second identical prompt hits its block-aligned turn boundary
    path = "/flush_cache" if mimic == "sglang" else "/reset_prefix_cache"
    assert httpx.post(engine.url + path, timeout=30).status_code == 200
    assert cached() == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_metrics_parse_with_their_declared_types(engines: dict[str, Engine], mimic: str) -> None:
    engine = engines[mimic]
    engine.client().chat.completions.create(model="m", messages=QUESTION, max_tokens=8)
    text = httpx.get(engine.url + "/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    declared = {}
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            name, kind = line.split()[2:4]
            # prometheus_client (and so both engines) declares counters with their _total sample name.
            declared[name.removesuffix("_total") if kind == "counter" else name] = kind
    assert {name: f.type for name, f in families.items()} == declared
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        family = families[f"{mimic}:{name}"]
        assert family.type == "histogram"
        assert next(s.value for s in family.samples if s.name.endswith("_count")) > 0
    assert all(f.samples for f in families.values())


@pytest.mark.timeout(60)
def test_sglang_server_info_names_the_pacing(engines: dict[str, Engine]) -> None:
    info = httpx.get(engines["sglang"].url + "/server_info", timeout=30).json()
    pacing = info["k3sim_pacing"]
    assert pacing["speed"] == 20.0 and 0 < pacing["decode_step_s_batch1"] < 0.01


def test_vllm_scale_out_routes_answer_403_as_vllm_serve_does(engines: dict[str, Engine]) -> None:
    # vllm-router 0.1.17 asks /v1/chat/completions/render first; vLLM 0.32 without --enable-scale-out: 403.
    r = httpx.post(f"{engines['vllm'].url}/v1/chat/completions/render", json={"model": "m", "messages": QUESTION},
                   timeout=30)
    assert r.status_code == 403 and r.json()["error"]["type"] == "PermissionDeniedError", r.text
    assert "--enable-scale-out" in r.json()["error"]["message"]
    assert httpx.post(f"{engines['sglang'].url}/v1/chat/completions/render", json={}, timeout=30).status_code == 404
