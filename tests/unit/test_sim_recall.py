"""The stand-in's recall of facts through its simulated KDA state, and the stream records validate builds."""
from __future__ import annotations

import json

import pytest

from k3deploy.sim.faults import parse_faults
from k3deploy.sim.recall import recall_answer, state_view
from k3deploy.sim.tokens import render_prompt
from k3deploy.validate import haystack
from k3deploy.validate.streamed import record

pytestmark = pytest.mark.timeout(30)
FACTS = haystack.facts_at([0.1, 0.5, 0.9])


def answer(fault: str, cached: int = 0) -> tuple[str, int]:
    text = haystack.haystack(400, FACTS, "n0") + "\n\n" + haystack.questions(FACTS)
    prompt = render_prompt([{"role": "user", "content": text}])
    view = state_view(parse_faults({"K3SIM_FAULT": fault}, 0), len(prompt.ids), cached)
    words = recall_answer(prompt.text, text, view)
    assert words is not None
    return " ".join(words), len(prompt.ids)


def test_a_clean_state_recalls_every_fact_in_the_order_asked() -> None:
    said, _ = answer("")
    assert said == " ".join(f.sentence for f in FACTS)
    assert haystack.retrieved(FACTS, said) == {0.1: True, 0.5: True, 0.9: True}


def test_a_zeroed_state_answers_fluently_with_every_fact_wrong() -> None:
    said, _ = answer("kda_state_zeroed")
    assert said.count("The access code of room-") == 3 and said.endswith(".")
    assert haystack.retrieved(FACTS, said) == {0.1: False, 0.5: False, 0.9: False}
    assert answer("kda_state_zeroed") == (said, answer("")[1])  # deterministic


def test_a_state_lost_beyond_a_depth_keeps_only_the_recent_facts() -> None:
    _, tokens = answer("")
    said, _ = answer(f"kda_state_lost_beyond:{tokens * 6 // 10}")
    assert haystack.retrieved(FACTS, said) == {0.1: False, 0.5: True, 0.9: True}


def test_a_wrong_restore_loses_what_the_hit_covered_and_only_on_a_hit() -> None:
    _, tokens = answer("")
    assert haystack.retrieved(FACTS, answer("wrong_cache_state")[0]) == dict.fromkeys([0.1, 0.5, 0.9], True)
    said, _ = answer("wrong_cache_state", cached=tokens * 7 // 10)
    assert haystack.retrieved(FACTS, said) == {0.1: False, 0.5: False, 0.9: True}


def test_no_question_no_recall() -> None:
    prompt = render_prompt([{"role": "user", "content": "hello"}])
    assert recall_answer(prompt.text, "hello", state_view(parse_faults({}, 0), 3, 0)) is None


def test_stream_records_read_both_dialects_and_keep_unknown_cached_tokens_unknown() -> None:
    def chunk(delta: dict[str, str], **extra: object) -> str:
        return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra})

    usage = {"prompt_tokens": 10, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 2}}
    for key in ("reasoning_content", "reasoning"):
        rec = record([(0.1, chunk({key: "think"})), (0.2, chunk({key: " more"})), (0.5, chunk({"content": "Hi"})),
                      (0.6, json.dumps({"choices": [], "usage": {**usage, "prompt_tokens_details": None}})),
                      (0.6, "[DONE]")])
        assert (rec.reasoning, rec.content, rec.ttft_s, rec.first_answer_s) == ("think more", "Hi", 0.1, 0.5)
        assert rec.cached_tokens is None and rec.reasoning_tokens == 2 and rec.completion_tokens == 3
        assert rec.itl_s == pytest.approx([0.1, 0.3])
    hit = record([(0.1, json.dumps({"choices": [], "usage": {**usage, "prompt_tokens_details": {"cached_tokens": 0}}}))])
    assert hit.cached_tokens == 0
