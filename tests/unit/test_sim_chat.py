"""Chat without processes: parsers per flag, cached tokens on turn 2, usage (limits, streaming, errors,
metrics, log prefixes: test_sim_chat_edges.py)."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.sim.admission import admit
from k3deploy.sim.chat_service import ApiError, ChatService
from k3deploy.sim.engine_args import parse_engine_args
from k3deploy.sim.generation import complete
from k3deploy.sim.log_format import EngineLog, first_gpu_ranks
from k3deploy.sim.serve_config import resolve_config
from k3deploy.sim.tokens import THINK_CLOSE, THINK_OPEN, TOOL_SECTION_BEGIN, render_prompt, tokenize
from tests.sim_requests import LONG_QUESTION, TOOLS

pytestmark = pytest.mark.timeout(30)

SGLANG_FULL = "--reasoning-parser kimi_k3 --tool-call-parser kimi_k3 --enable-cache-report --enable-metrics"
VLLM_FULL = (
    "--reasoning-parser kimi_k3 --tool-call-parser kimi_k3 --enable-auto-tool-choice --enable-prefix-caching "
    "--enable-prompt-tokens-details"
)


def service(mimic: str, argv: str = "", context: int = 32768) -> ChatService:
    ctx_flag = "--context-length" if mimic == "sglang" else "--max-model-len"
    ns = parse_engine_args(mimic, ["--mimic", mimic, "/m", ctx_flag, str(context), *argv.split()])  # type: ignore[arg-type]
    cfg = resolve_config(mimic, ns, {})  # type: ignore[arg-type]
    cat = load_catalog()
    adm = admit(cfg, cat.models["kimi-k3-tiny"], cat.hardware["sim"])
    ranks = first_gpu_ranks(0, 1, tp=1, pp=1, ep=1, dp=1, attention_dp=False, nnodes=1)
    svc = ChatService(cfg, adm, EngineLog(cfg.mimic, ranks, io.StringIO()))
    svc.state = "ready"
    return svc


def ask(svc: ChatService, **body: Any) -> dict[str, Any]:
    body.setdefault("messages", [{"role": "user", "content": "What is the weather in Paris?"}])
    reply = svc.chat(body).body
    assert reply is not None
    return reply


def test_tokenizer_keeps_k3_special_tokens_whole() -> None:
    assert tokenize(f"{THINK_OPEN} a b {THINK_CLOSE}ok") == [
        "<|open|>",
        "think",
        "<|sep|>",
        "a",
        "b",
        "<|close|>",
        "think",
        "<|sep|>",
        "ok",
    ]
    prompt = render_prompt([{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "d"}])
    assert prompt.boundaries == [7, 12] and len(prompt.ids) == 15


def test_completion_is_deterministic_and_mostly_reasoning() -> None:
    messages = [{"role": "user", "content": "Explain prefix caching"}]
    assert complete(messages) == complete(messages)
    low, high, top = (complete(messages, effort=e) for e in ("low", "high", "max"))
    assert low.tokens < high.tokens < top.tokens
    assert 0.78 <= low.reasoning_tokens / low.tokens <= 0.86


@pytest.mark.parametrize(
    ("mimic", "argv", "key"), [("sglang", SGLANG_FULL, "reasoning_content"), ("vllm", VLLM_FULL, "reasoning")]
)
def test_reasoning_parser_splits_the_thinking(mimic: str, argv: str, key: str) -> None:
    msg = ask(service(mimic, argv))["choices"][0]["message"]
    assert msg[key].startswith("The user asks: What is the weather in Paris?")
    assert THINK_OPEN not in msg["content"] and THINK_CLOSE not in msg["content"]


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_without_the_reasoning_parser_the_markers_stay_in_content(mimic: str) -> None:
    reply = ask(service(mimic))
    msg = reply["choices"][0]["message"]
    assert msg["content"].startswith(THINK_OPEN) and THINK_CLOSE in msg["content"]
    assert msg.get("reasoning_content") is None and msg.get("reasoning") is None
    # vLLM counts reasoning tokens only with a reasoning parser (chat_completion/serving.py:
    # `_include_reasoning_tokens_details = bool(reasoning_parser)`), and never in text completions
    if mimic == "vllm":
        assert reply["usage"]["completion_tokens_details"] is None
        assert ask(service(mimic, VLLM_FULL))["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
        text = service(mimic, VLLM_FULL).completion({"model": "/m", "prompt": "The harbour", "max_tokens": 4})
        assert text.body is not None and text.body["usage"]["completion_tokens_details"] is None
    else:
        assert reply["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert reply["usage"]["prompt_tokens_details"] is None


@pytest.mark.parametrize(("mimic", "argv"), [("sglang", SGLANG_FULL), ("vllm", VLLM_FULL)])
def test_tool_parser_returns_structured_calls(mimic: str, argv: str) -> None:
    reply = ask(
        service(mimic, argv),
        tools=TOOLS,
        messages=[{"role": "user", "content": "Call get_weather for Paris"}],
    )
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"] == "functions.get_weather:0"
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris"
    }
    assert choice["message"]["content"] is None


def test_sglang_without_tool_parser_leaves_k3_tool_tokens_in_content() -> None:
    choice = ask(
        service("sglang", "--reasoning-parser kimi_k3"),
        tools=TOOLS,
        messages=[{"role": "user", "content": "Call get_weather for Paris"}],
    )["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
    assert (
        TOOL_SECTION_BEGIN in choice["message"]["content"]
        and "functions.get_weather:0" in choice["message"]["content"]
    )


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_named_tool_choice_is_structured_without_a_tool_parser(mimic: str) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = ask(service(mimic), tools=TOOLS, tool_choice=named)["choices"][0]
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_vllm_auto_tool_choice_needs_both_flags() -> None:
    with pytest.raises(
        ApiError, match='"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'
    ):
        ask(service("vllm", "--reasoning-parser kimi_k3 --tool-call-parser kimi_k3"), tools=TOOLS)
    # tool_choice none: tools are ignored, no error
    ask(service("vllm"), tools=TOOLS, tool_choice="none")


@pytest.mark.parametrize(("mimic", "argv"), [("sglang", SGLANG_FULL), ("vllm", VLLM_FULL)])
def test_second_turn_reports_cached_tokens(mimic: str, argv: str) -> None:
    svc = service(mimic, argv)
    turn1 = [{"role": "user", "content": LONG_QUESTION}]
    first = ask(svc, messages=turn1)
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    turn2 = [
        *turn1,
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And in one word?"},
    ]
    second = ask(svc, messages=turn2)
    assert (
        second["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024
    )  # the turn boundary, block-aligned
    metrics = svc.metrics.render().decode()
    name = "sglang:cached_tokens_total" if mimic == "sglang" else "vllm:prefix_cache_hits_total"
    assert re.search(rf"^{re.escape(name)}{{[^}}]*}} 1024\.0$", metrics, re.MULTILINE)


def test_vllm_cache_salt_shares_blocks_only_between_requests_with_the_same_salt() -> None:
    """vLLM's per-request cache_salt enters the first block's hash: another salt (or none) hits nothing."""
    svc = service("vllm", VLLM_FULL)
    turn1 = [{"role": "user", "content": LONG_QUESTION}]
    first = ask(svc, messages=turn1, cache_salt="tenant-a")
    turn2 = [*turn1, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And in one word?"}]

    def cached(**salt: Any) -> int:
        return int(ask(svc, messages=turn2, **salt)["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(cache_salt="tenant-b") == 0
    assert cached() == 0
    assert cached(cache_salt="tenant-a") == 1024
    with pytest.raises(ApiError, match="Parameter 'cache_salt' must be a non-empty string if provided."):
        ask(svc, messages=turn2, cache_salt="")


@pytest.mark.parametrize(
    ("mimic", "argv"),
    [("sglang", "--enable-cache-report --disable-radix-cache"), ("vllm", "--enable-prompt-tokens-details")],
)
def test_prefix_cache_off_reports_zero_cached(mimic: str, argv: str) -> None:
    svc = service(mimic, argv)
    turn1 = [{"role": "user", "content": LONG_QUESTION}]
    ask(svc, messages=turn1)
    second = ask(
        svc, messages=[*turn1, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    )
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
