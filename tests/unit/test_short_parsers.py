"""The short stage judges what the model's catalog entry makes the engine do: no reasoning split is asked of a
model without a reasoning parser, and the pass says what it left out and why."""
from __future__ import annotations

import pytest

from k3deploy.validate.stages.short import SCHEMA, Answer, _passed, chat_problems, structured_problems

FAST = pytest.mark.timeout(30)


@FAST
def test_no_reasoning_parser_asks_no_split() -> None:
    answer = Answer(content="Paris.", finish_reason="stop")
    assert chat_problems(answer, None, 16) == []
    assert chat_problems(answer, "reasoning", 16) == [
        "no reasoning in `reasoning`: the reasoning parser did not split it off"]


@FAST
def test_a_pass_names_what_the_catalog_left_out() -> None:
    assert _passed(None, ("chat", "structured output")) == (
        "chat and structured output, streamed and not: content valid per the response_format schema, finish_reason "
        "as expected; not the reasoning split nor tool calls: the model's catalog entry names no such parser")
    assert _passed("reasoning", ("chat", "tool call", "structured output")).startswith(
        "chat, tool call and structured output, streamed and not: reasoning in `reasoning`, tool_calls valid")


@FAST
def test_a_structured_answer_is_held_to_its_schema() -> None:
    good = Answer(content='{"city": "Paris", "country": "France", "population_millions": 2.1}', finish_reason="stop")
    assert structured_problems(good, None, SCHEMA) == []
    prose = Answer(content="Paris, in France.", finish_reason="stop")
    (said,) = structured_problems(prose, None, SCHEMA)
    assert said.startswith("content is not JSON (") and "the response_format JSON schema was not applied" in said
    short = Answer(content='{"city": "Paris", "population_millions": -1}', finish_reason="length")
    shown = 'content {"city": "Paris", "population_millions": -1} breaks the response_format schema: '
    assert structured_problems(short, None, SCHEMA) == [
        shown + "'country' is a required property", shown + "-1 is less than the minimum of 0",
        "finish_reason 'length', expected 'stop'"]
