"""Streams without processes: every cut of every answer streams whole, a dropped client frees its slot,
and the performance model's arithmetic."""

from __future__ import annotations

from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.sim.generation import complete
from k3deploy.sim.pacing import PacingError, PerfModel, speed_factor
from k3deploy.sim.tokens import (
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_ARGUMENT_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_SECTION_BEGIN,
    TOOL_SECTION_END,
    tokenize,
)
from tests.sim_requests import TOOLS
from tests.unit.test_sim_chat import SGLANG_FULL, VLLM_FULL, service

pytestmark = pytest.mark.timeout(60)
TOOL_ASK = [{"role": "user", "content": "Call get_weather for Paris"}]


def run_both(mimic: str, argv: str, **body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    svc = service(mimic, argv)
    whole = svc.chat({**body, "stream": False}).body
    chunks = svc.chat({**body, "stream": True, "stream_options": {"include_usage": True}}).chunks
    assert whole is not None and chunks is not None
    return whole, list(chunks)


@pytest.mark.parametrize(
    ("mimic", "argv", "key"),
    [
        ("sglang", SGLANG_FULL, "reasoning_content"),
        ("vllm", VLLM_FULL, "reasoning"),
        ("sglang", "", "reasoning_content"),
        ("vllm", "--tool-call-parser kimi_k3 --enable-auto-tool-choice", "reasoning"),
    ],
)
def test_every_cut_streams_what_the_whole_answer_says(mimic: str, argv: str, key: str) -> None:
    natural = complete(TOOL_ASK, tools=TOOLS, tool_choice="auto", effort="low")
    for max_tokens in range(1, natural.tokens + 2):
        whole, chunks = run_both(mimic, argv, messages=TOOL_ASK, tools=TOOLS, reasoning_effort="low",
                                 max_tokens=max_tokens)  # fmt: skip
        choice = whole["choices"][0]
        message, body = choice["message"], chunks[:-1]
        deltas = [c["choices"][0]["delta"] for c in body]
        assert "".join(d.get("content") or "" for d in deltas) == (message["content"] or "")
        assert "".join(d.get(key) or "" for d in deltas) == (message[key] or "")
        args = "".join(
            tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls") or []
        )
        assert args == "".join(tc["function"]["arguments"] for tc in message.get("tool_calls") or [])
        finishes = [c["choices"][0]["finish_reason"] for c in body if c["choices"][0]["finish_reason"]]
        assert finishes == [choice["finish_reason"]]
        # vLLM leaves an unset completion_tokens_details out of the stream's usage; the whole reply has it null
        assert chunks[-1]["usage"] == {k: v for k, v in whole["usage"].items()
                                       if v is not None or k != "completion_tokens_details"}
        assert whole["usage"]["completion_tokens"] == min(max_tokens, natural.tokens)
        for d in deltas[1:]:  # after the role chunk: at most one token per chunk
            text = (
                (d.get("content") or "")
                + (d.get(key) or "")
                + "".join(
                    (tc.get("id") or "") + tc["function"].get("arguments", "")
                    for tc in d.get("tool_calls") or []
                )
            )
            assert len(tokenize(text)) <= 1
    assert choice["finish_reason"] == ("tool_calls" if "tool-call-parser" in argv else "stop")


def _token_chunks(chunks: list[dict[str, Any]]) -> int:
    """Chunks that carry a token: text, reasoning or a tool-call fragment (not the role, finish or usage)."""
    def carries(c: dict[str, Any]) -> bool:
        choice = (c.get("choices") or [{}])[0]
        delta = choice.get("delta") or {}
        return bool(choice.get("text") or delta.get("content") or delta.get("reasoning")
                    or delta.get("reasoning_content") or delta.get("tool_calls"))
    return sum(1 for c in chunks if carries(c))


MARKER_TOKENS = {  # the tokens a parser turns into no delta (vLLM: "a control token ... without streaming a chunk")
    "reasoning": len(tokenize(THINK_OPEN)) + len(tokenize(THINK_CLOSE)),
    "tool": len(tokenize(TOOL_SECTION_BEGIN + TOOL_CALL_BEGIN + TOOL_ARGUMENT_BEGIN + TOOL_CALL_END
                         + TOOL_SECTION_END)),
}


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_one_chunk_per_generated_token_but_the_markers_a_parser_swallows(mimic: str) -> None:
    ask = [{"role": "user", "content": "Hello, how are you today? Tell me: all of it."}]
    parsers = VLLM_FULL if mimic == "vllm" else SGLANG_FULL
    reasoning_only = parsers.replace("--tool-call-parser kimi_k3", "").replace("--enable-auto-tool-choice", "")
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    cases = [  # (argv, body, marker tokens swallowed)
        ("", {"prompt": "Say: hello, world."}, 0),  # text completion, raw
        ("", {"prompt": "Say: hello, world.", "max_tokens": 40}, 0),
        ("", {"messages": ask}, 0),  # chat without parsers: the markers are content, one chunk each
        (reasoning_only, {"messages": ask}, MARKER_TOKENS["reasoning"]),
        (reasoning_only, {"messages": ask, "reasoning_effort": "low"}, MARKER_TOKENS["reasoning"]),
        (parsers, {"messages": TOOL_ASK, "tools": TOOLS, "reasoning_effort": "low"},
         MARKER_TOKENS["reasoning"] + MARKER_TOKENS["tool"]),
    ]
    for argv, body, swallowed in cases:
        svc = service(mimic, argv)
        reply = (svc.completion if "prompt" in body else svc.chat)({**body, **stream})
        assert reply.chunks is not None
        chunks = list(reply.chunks)
        tokens = chunks[-1]["usage"]["completion_tokens"]
        assert _token_chunks(chunks) == tokens - swallowed, (argv, body)
    # The case: 16 tokens on the vLLM mimic came as 13 chunks: the 3 tokens of the think opener
    # (`<|open|>`, `think`, `<|sep|>`) that the reasoning parser swallows, as vLLM swallows them.
    reply = service(mimic, reasoning_only).chat({"messages": ask, "max_tokens": 16, **stream})
    assert reply.chunks is not None
    chunks = list(reply.chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert _token_chunks(chunks) == 16 - len(tokenize(THINK_OPEN)) == 13


def test_sglang_sends_finish_in_its_own_chunk_and_vllm_with_the_last_token() -> None:
    _, sglang = run_both("sglang", SGLANG_FULL, messages=TOOL_ASK, max_tokens=30)
    _, vllm = run_both("vllm", VLLM_FULL, messages=TOOL_ASK, max_tokens=30)
    assert sglang[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert vllm[-2]["choices"][0]["finish_reason"] == "length" and vllm[-2]["choices"][0]["delta"]


def test_a_dropped_stream_frees_its_slot_and_is_counted_as_aborted() -> None:
    svc = service("vllm", VLLM_FULL)
    chunks = svc.chat({"messages": TOOL_ASK, "stream": True}).chunks
    assert chunks is not None
    next(chunks), next(chunks)
    assert svc.stats.running == 1
    chunks.close()  # what the HTTP server does when the client goes away
    assert svc.stats.running == 0
    assert b'vllm:request_success_total{engine="0",finished_reason="abort"' in svc.metrics.render()


def test_completions_default_to_sixteen_tokens_and_keep_the_markers() -> None:
    reply = service("sglang", SGLANG_FULL).completion({"prompt": "hello"}).body
    assert reply is not None and reply["usage"]["completion_tokens"] == 16
    assert reply["choices"][0]["text"].startswith("<|open|>think<|sep|>")


def tiny_model(gpu: str = "sim", speed: float = 1.0) -> PerfModel:
    cat = load_catalog()
    return PerfModel.build(
        cat.models["kimi-k3-tiny"], cat.hardware[gpu], attn_tp=1, expert_shards=1, kv_bytes_per_token=288,
        state_bytes_per_request=0, speed=speed,
    )  # fmt: skip


def test_step_time_is_the_roofline_of_the_catalog_figures() -> None:
    cat = load_catalog()
    w, hw = cat.models["kimi-k3-tiny"].weights, cat.hardware["sim"]
    active = w.non_expert_bytes + w.routed_expert_bytes * 4 / 32  # 4 of 32 experts per token
    model = tiny_model()
    assert model.step_s(1) == pytest.approx(active / (hw.bandwidth_tbps * 1e12))
    assert model.step_s(1) < model.step_s(2) < model.step_s(8) < model.step_s(64)
    assert model.step_s(1, 10_000) == pytest.approx(
        model.step_s(1) + 288 * 10_000 / (hw.bandwidth_tbps * 1e12)
    )
    assert model.prefill_s(0) == 0 and model.prefill_s(100) < model.prefill_s(1000) < model.prefill_s(4000)
    assert tiny_model(speed=10).step_s(4) == pytest.approx(model.step_s(4) / 10)


def test_speed_factor_must_be_a_positive_number() -> None:
    assert speed_factor({}) == 1.0 and speed_factor({"K3SIM_SPEED": "2.5"}) == 2.5
    for bad in ("0", "-1", "fast"):
        with pytest.raises(PacingError, match="K3SIM_SPEED"):
            speed_factor({"K3SIM_SPEED": bad})
