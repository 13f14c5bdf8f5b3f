"""Chat without processes, at its edges: over-long requests and max_tokens as each engine answers them,
streaming chunks, error envelopes, metric families and their types, log prefixes."""

from __future__ import annotations

import io
import re

import pytest

from k3deploy.sim.chat_service import ApiError
from k3deploy.sim.log_format import EngineLog, first_gpu_ranks

pytestmark = pytest.mark.timeout(30)
from tests.unit.test_sim_chat import SGLANG_FULL, VLLM_FULL, ask, service

pytestmark = pytest.mark.timeout(30)


def test_over_long_requests_are_rejected_like_each_engine() -> None:
    long = [{"role": "user", "content": "w " * 200}]
    with pytest.raises(
        ApiError, match=r"Input length \(20\d tokens\) exceeds the maximum allowed length \(99 tokens\)"
    ):
        ask(service("sglang", context=100), messages=long)
    # vLLM 0.32.0's words (vllm/renderers/params.py), checked against the real engine by
    # tests/realengine/test_vllm_conformance.py
    with pytest.raises(ApiError, match=r"maximum context length is 100 tokens\. However, your prompt contains "
                       r"at least 101 input tokens, which exceeds this limit even without any output tokens\. "
                       r".* \(parameter=input_tokens, value=101\)") as err:
        ask(service("vllm", context=100), messages=long)
    assert err.value.param == "input_tokens"
    with pytest.raises(ApiError, match=r"max_tokens=190 cannot be greater than max_model_len=100"):
        ask(service("vllm", context=100), max_tokens=190)
    # Past the room the prompt leaves but within the context: clamped to that room, as vLLM does.
    clamped = ask(service("vllm", context=100), max_tokens=95)
    assert clamped["usage"]["prompt_tokens"] + clamped["usage"]["completion_tokens"] <= 100


def test_max_tokens_cuts_the_completion() -> None:
    choice = ask(service("vllm", VLLM_FULL), max_tokens=5)
    assert choice["choices"][0]["finish_reason"] == "length" and choice["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(
    ("mimic", "argv", "key"), [("sglang", SGLANG_FULL, "reasoning_content"), ("vllm", VLLM_FULL, "reasoning")]
)
def test_streaming_chunks_add_up_to_the_message(mimic: str, argv: str, key: str) -> None:
    svc = service(mimic, argv)
    body = {
        "messages": [{"role": "user", "content": "Stream please"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = svc.chat(body)
    assert reply.chunks is not None
    chunks = list(reply.chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    message = svc.chat({**body, "stream": False}).body["choices"][0]["message"]  # type: ignore[index]
    assert "".join(d.get(key, "") for d in deltas) == message[key]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def test_error_envelopes_and_model_name() -> None:
    vllm = service("vllm")
    with pytest.raises(ApiError) as err:
        ask(vllm, model="gpt-4")
    assert (
        err.value.status == 404
        and vllm.error_body(err.value)["error"] == {"message": "The model `gpt-4` does not exist. Valid aliases: /m.",
                                                    "type": "NotFoundError", "param": "model", "code": 404}
    )
    assert service("sglang").error_body(ApiError(400, "x"))["object"] == "error"
    assert vllm.models()["data"][0]["id"] == "/m"


@pytest.mark.parametrize(
    ("mimic", "families"),
    [
        (
            "sglang",
            {
                "sglang:cache_hit_rate": "gauge",
                "sglang:cached_tokens": "counter",
                "sglang:prompt_tokens": "counter",
                "sglang:generation_tokens": "counter",
                "sglang:num_requests": "counter",
                "sglang:token_usage": "gauge",
                "sglang:mamba_usage": "gauge",
                "sglang:num_running_reqs": "gauge",
                "sglang:num_queue_reqs": "gauge",
                "sglang:time_to_first_token_seconds": "histogram",
                "sglang:inter_token_latency_seconds": "histogram",
                "sglang:e2e_request_latency_seconds": "histogram",
            },
        ),
        (
            "vllm",
            {
                "vllm:prefix_cache_queries": "counter",
                "vllm:prefix_cache_hits": "counter",
                "vllm:kv_cache_usage_perc": "gauge",
                "vllm:prompt_tokens": "counter",
                "vllm:generation_tokens": "counter",
                "vllm:request_success": "counter",
                "vllm:num_requests_running": "gauge",
                "vllm:num_requests_waiting": "gauge",
                "vllm:time_to_first_token_seconds": "histogram",
                "vllm:inter_token_latency_seconds": "histogram",
                "vllm:e2e_request_latency_seconds": "histogram",
            },
        ),
    ],
)
def test_metric_families_parse_with_their_declared_types(mimic: str, families: dict[str, str]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    svc = service(mimic)
    ask(svc, max_tokens=20)
    parsed = {f.name: f for f in text_string_to_metric_families(svc.metrics.render().decode())}
    assert {name: f.type for name, f in parsed.items()} == families
    samples = {s.name: s.value for f in parsed.values() for s in f.samples}
    assert samples[f"{mimic}:generation_tokens_total"] == 20.0
    itl = "sglang:inter_token_latency_seconds" if mimic == "sglang" else "vllm:inter_token_latency_seconds"
    assert samples[f"{itl}_count"] == 19.0  # one gap between each pair of the 20 tokens
    ttft = f"{mimic}:time_to_first_token_seconds_count"
    assert samples[ttft] == 1.0


def test_log_prefixes() -> None:
    ranks = first_gpu_ranks(2, 8, tp=32, pp=1, ep=32, dp=1, attention_dp=False, nnodes=4)
    assert (ranks.tp, ranks.ep, ranks.world_rank, ranks.world_size) == (16, 16, 16, 32)
    out = io.StringIO()
    EngineLog("sglang", ranks, out).info("Init parallel begin.")
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d DP0 PP0 TP16 EP16\] Init parallel begin\.\n", out.getvalue()
    )
    out = io.StringIO()
    EngineLog("vllm", ranks, out).info(
        "Starting vLLM server on http://h:1", source="server", where="api_server.py:1"
    )
    assert re.fullmatch(
        r"\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[api_server\.py:1\] Starting vLLM "
        r"server on http://h:1\n",
        out.getvalue(),
    )
