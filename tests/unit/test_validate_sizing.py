"""Prompts sized by the engine's tokenizer, and the engine's own error shown when sizing fails (issue 25:
vLLM's HTTP 400 for a prompt past the context was reported as "no usage.prompt_tokens"); plan warns when the
validate budgets cannot fit a small context; no "first answer p50 0 ms" when no answer token arrived."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.validate import haystack
from k3deploy.validate.stages.effort import _line
from k3deploy.validate.stages.long import sized, sizing_failed

HTTP_400 = ('POST http://10.0.0.1:8000/v1/chat/completions: HTTP 400: {"error": {"message": "This model\'s '
            'maximum context length is 2048 tokens. However, your request has 2757 input tokens.", "code": 400}}')


class FakeChat:
    """Counts like a tokenizer of `per_sentence` tokens per filler sentence up to `context` tokens, then
    answers as the engine does past its context."""

    def __init__(self, per_sentence: int, context: int) -> None:
        self.per_sentence, self.context = per_sentence, context
        self.asked: list[int] = []

    def count(self, messages: list[dict[str, Any]]) -> int | str:
        text = messages[0]["content"]
        tokens = 20 + self.per_sentence * text.count(". ")
        self.asked.append(tokens)
        return HTTP_400 if tokens > self.context else tokens


def test_the_engines_error_is_the_reason_when_nothing_fits() -> None:
    chat = FakeChat(per_sentence=60, context=300)
    why = sized(chat, haystack.facts_at([0.5]))  # type: ignore[arg-type]
    assert why == HTTP_400
    result = sizing_failed("long", why)
    assert result.status == "fail" and "HTTP 400" in result.detail and "maximum context length" in result.detail
    assert "usage.prompt_tokens" not in result.detail


def test_a_small_context_is_sized_with_the_shorter_calibration() -> None:
    chat = FakeChat(per_sentence=60, context=2048)  # 96 sentences (5,780 tokens) do not fit, 16 do
    sizing = sized(chat, [])  # type: ignore[arg-type]
    assert isinstance(sizing, haystack.Sizing) and round(sizing.per_sentence) == 60
    assert abs(sizing.tokens_for(sizing.sentences_for(1024)) - 1024) <= 60


def test_first_answer_is_not_zero_when_no_answer_token_arrived() -> None:
    s = {"output_throughput": 10.0, "output_throughput_per_gpu": 10.0, "median_ttft_ms": 50.0,
         "median_ttfa_ms": 0.0, "mean_tpot_ms": 5.0, "p99_itl_ms": 9.0, "reasoning_token_share": 1.0,
         "completed": 4, "answered": 0}
    line = _line("cold", s)
    assert "first answer p50 0 ms" not in line and "no answer token arrived" in line
    assert "(3 of 4 answered)" in _line("cold", {**s, "answered": 3, "median_ttfa_ms": 120.0})


def _topology(tmp: Path, context: int) -> Path:
    doc = {"name": "budgets", "model": {"id": "kimi-k3-tiny", "path": "/ckpt", "revision": "r1"},
           "hardware": {"gpu": "sim", "gpus_per_node": 1},
           "nodes": [{"host": "localhost", "ip": "127.0.0.1", "iface": "lo"}],
           "engine": {"kind": "sim", "mimic": "vllm", "port": 18000}, "parallel": {"tp": 1, "ep": 1},
           "launch": {"executor": "local"},
           "serving": {"context_length": context, "max_running_requests": 4}}
    path = tmp / f"budgets-{context}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_plan_warns_when_the_default_budgets_cannot_fit_a_small_context(tmp_path: Path) -> None:
    small = {i.code: i for i in require_feasible(_topology(tmp_path, 2048), catalog_for(None)).issues}
    assert {"VALIDATE_LONG_ROOM", "VALIDATE_PREFIX_ROOM", "VALIDATE_EFFORT_ROOM"} <= set(small)
    assert all(small[c].severity == "warning" for c in small if c.startswith("VALIDATE_"))
    assert "serving.context_length 2,048" in small["VALIDATE_EFFORT_ROOM"].message
    large = require_feasible(_topology(tmp_path, 32768), catalog_for(None)).issues
    assert not [i for i in large if i.code.startswith("VALIDATE_")]
