"""The short stage judges what the model's catalog entry makes the engine do: no reasoning split is asked of a
model without a reasoning parser, and the pass says what it left out and why."""
from __future__ import annotations

import pytest

from k3deploy.validate.stages.short import Answer, _passed, chat_problems

FAST = pytest.mark.timeout(30)


@FAST
def test_no_reasoning_parser_asks_no_split() -> None:
    answer = Answer(content="Paris.", finish_reason="stop")
    assert chat_problems(answer, None, 16) == []
    assert chat_problems(answer, "reasoning", 16) == [
        "no reasoning in `reasoning`: the reasoning parser did not split it off"]


@FAST
def test_a_pass_names_what_the_catalog_left_out() -> None:
    assert _passed(None, ("chat",)) == (
        "chat, streamed and not: finish_reason as expected; not the reasoning split nor tool calls: the model's "
        "catalog entry names no such parser")
    assert _passed("reasoning", ("chat", "tool call")).startswith("chat and tool call, streamed and not: reasoning")
