"""Deterministic K3-style completions (the model always thinks) and the kimi_k3 reasoning/tool parsers."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from k3deploy.sim.tokens import (
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_ARGUMENT_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_SECTION_BEGIN,
    TOOL_SECTION_END,
    message_text,
    token_spans,
)

# Reasoning words per effort; with a 12-word answer and the 6 think-marker tokens, reasoning is ~82% of
# the completion at low effort, as K3's was measured (~81%), and more at high and max.
EFFORT_REASONING_WORDS = {"low": 48, "high": 96, "max": 192}
DEFAULT_EFFORT = "max"
ANSWER_WORDS = 12
_FILLER = (
    "consider",
    "the",
    "request",
    "check",
    "each",
    "step",
    "then",
    "verify",
    "that",
    "answer",
    "is",
    "consistent",
    "with",
    "what",
    "was",
    "asked",
    "and",
    "keep",
    "it",
    "short",
)
_CALL_RE = re.compile(
    re.escape(TOOL_CALL_BEGIN)
    + r"(?P<id>.*?)"
    + re.escape(TOOL_ARGUMENT_BEGIN)
    + r"(?P<args>.*?)"
    + re.escape(TOOL_CALL_END),
    re.DOTALL,
)
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Completion:
    """Raw generated text (what a detokenizer returns before any parser) and why it stopped."""

    raw: str
    tokens: int
    reasoning_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class ParsedMessage:
    """The assistant message after the engine's parsers (or without them)."""

    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str


def _words(text: str) -> list[str]:
    return text.split()


def _filler(seed: bytes, count: int) -> list[str]:
    digest = hashlib.sha256(seed).digest()
    return [_FILLER[(digest[i % len(digest)] + i) % len(_FILLER)] for i in range(count)]


def _fit(words: list[str], count: int, seed: bytes) -> str:
    return " ".join((words + _filler(seed, count))[:count])


def wanted_tool(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, tool_choice: Any
) -> dict[str, Any] | None:
    """The tool the model calls: named by tool_choice, required, or mentioned in the last user message."""
    if not tools or tool_choice == "none" or not messages or messages[-1].get("role") != "user":
        return None
    functions = [t.get("function", {}) for t in tools if isinstance(t, dict)]
    if isinstance(tool_choice, dict):
        name = tool_choice.get("function", {}).get("name")
        return next((f for f in functions if f.get("name") == name), None)
    if tool_choice == "required":
        return functions[0] if functions else None
    asked = message_text(messages[-1].get("content")).lower()
    for fn in functions:
        name = str(fn.get("name", ""))
        if name and (name.lower() in asked or name.replace("_", " ").lower() in asked):
            return fn
    return None


def _argument(schema: dict[str, Any], last_word: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    return {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}.get(str(kind), last_word)


def tool_arguments(fn: dict[str, Any], user_text: str) -> dict[str, Any]:
    """Arguments for a call: required parameters filled deterministically (strings: the last word asked)."""
    params = fn.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    names = params.get("required") or list(props)
    words = _WORD_RE.findall(user_text)
    last_word = words[-1] if words else "value"
    return {name: _argument(props.get(name, {}), last_word) for name in names}


def complete(
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    effort: str | None = None,
    max_tokens: int | None = None,
) -> Completion:
    """The raw completion for a conversation, cut at max_tokens."""
    seed = json.dumps([messages, tools, tool_choice, effort], sort_keys=True, default=str).encode()
    last = messages[-1] if messages else {}
    asked = message_text(last.get("content"))
    words = EFFORT_REASONING_WORDS.get(effort or DEFAULT_EFFORT, EFFORT_REASONING_WORDS[DEFAULT_EFFORT])
    verb = "The tool returned:" if last.get("role") == "tool" else "The user asks:"
    reasoning = _fit([*verb.split(), *_words(asked)[:12]], words, seed + b"r")
    fn = wanted_tool(messages, tools, tool_choice)
    if fn is not None:
        args = json.dumps(tool_arguments(fn, asked), ensure_ascii=False)
        tail = (
            f"{TOOL_SECTION_BEGIN}{TOOL_CALL_BEGIN}functions.{fn.get('name')}:0{TOOL_ARGUMENT_BEGIN}{args}"
            f"{TOOL_CALL_END}{TOOL_SECTION_END}"
        )
    else:
        tail = _fit(["Stand-in", "answer:", *_words(asked)[:6]], ANSWER_WORDS, seed + b"a")
    raw = f"{THINK_OPEN} {reasoning} {THINK_CLOSE}{tail}"
    spans = token_spans(raw)
    close_at = raw.index(THINK_CLOSE) + len(THINK_CLOSE)
    finish = "stop"
    if max_tokens is not None and 0 <= max_tokens < len(spans):
        spans, finish = spans[:max_tokens], "length"
        raw = raw[: spans[-1][1]] if spans else ""
    reasoning_tokens = sum(1 for _, end in spans if end <= close_at)
    return Completion(raw=raw, tokens=len(spans), reasoning_tokens=reasoning_tokens, finish_reason=finish)


def _tool_calls(section: str) -> list[dict[str, Any]]:
    calls = []
    for i, m in enumerate(_CALL_RE.finditer(section)):
        call_id = m.group("id").strip()
        name = call_id.split(".", 1)[-1].rsplit(":", 1)[0]
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "index": i,
                "function": {"name": name, "arguments": m.group("args").strip()},
            }
        )
    return calls


def parse(c: Completion, *, reasoning_parser: bool, tool_parser: bool) -> ParsedMessage:
    """Apply the kimi_k3 reasoning and tool-call parsers that are enabled; without them the raw text stays."""
    content: str | None = c.raw
    reasoning: str | None = None
    finish = c.finish_reason
    if reasoning_parser and c.raw.startswith(THINK_OPEN):
        body = c.raw[len(THINK_OPEN) :]
        reasoning, closed, rest = body.partition(THINK_CLOSE)
        reasoning = reasoning.strip()
        content = rest if closed else None
    calls: list[dict[str, Any]] | None = None
    if tool_parser and content and TOOL_SECTION_BEGIN in content and TOOL_SECTION_END in content:
        before, _, section = content.partition(TOOL_SECTION_BEGIN)
        calls = _tool_calls(section) or None
        if calls:
            content = before.strip() or None
            finish = "tool_calls" if finish == "stop" else finish
    return ParsedMessage(
        content=content or None, reasoning=reasoning or None, tool_calls=calls, finish_reason=finish
    )
