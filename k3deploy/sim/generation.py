"""Deterministic K3-style completions (the model always thinks), token by token, each token labelled with
the part of K3's output it belongs to so that the streaming parsers never need to look back."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

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

Kind = Literal["think", "reasoning", "content", "tool_marker", "tool_id", "tool_args"]

# Reasoning words per effort; with a 12-word answer and the 6 think-marker tokens, reasoning is ~82% of
# the completion at low effort, as K3's was measured (~81%), and more at high and max.
EFFORT_REASONING_WORDS = {"low": 48, "high": 96, "max": 192}
DEFAULT_EFFORT = "max"
ANSWER_WORDS = 12
FILLER_WORDS = (
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
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Piece:
    """One generated token: its text with the whitespace before it, and which part of the output it is."""

    kind: Kind
    text: str


@dataclass(frozen=True)
class Completion:
    """The generated tokens (what a detokenizer returns before any parser) and why generation stopped."""

    pieces: tuple[Piece, ...]
    finish_reason: str

    @property
    def raw(self) -> str:
        """The raw text, markers included."""
        return "".join(p.text for p in self.pieces)

    @property
    def tokens(self) -> int:
        """Completion tokens."""
        return len(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of the think block, its markers included."""
        return sum(1 for p in self.pieces if p.kind in ("think", "reasoning"))


def _words(text: str) -> list[str]:
    return text.split()


def _filler(seed: bytes, count: int) -> list[str]:
    digest = hashlib.sha256(seed).digest()
    return [FILLER_WORDS[(digest[i % len(digest)] + i) % len(FILLER_WORDS)] for i in range(count)]


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


def _tail(fn: dict[str, Any] | None, asked: str, seed: bytes, answer: Sequence[str] | None) -> list[tuple[Kind, str]]:
    if fn is None and answer is not None:
        return [("content", " " + " ".join(answer))]
    if fn is None:
        return [("content", _fit(["Stand-in", "answer:", *_words(asked)[:6]], ANSWER_WORDS, seed + b"a"))]
    args = json.dumps(tool_arguments(fn, asked), ensure_ascii=False)
    return [
        ("tool_marker", TOOL_SECTION_BEGIN + TOOL_CALL_BEGIN),
        ("tool_id", f"functions.{fn.get('name')}:0"),
        ("tool_marker", TOOL_ARGUMENT_BEGIN),
        ("tool_args", args),
        ("tool_marker", TOOL_CALL_END + TOOL_SECTION_END),
    ]


def _pieces(segments: Sequence[tuple[Kind, str]]) -> list[Piece]:
    """Tokenize the whole text once and label each token by the segment it ends in."""
    raw, ends, kinds = "", [], []
    for kind, text in segments:
        raw += text
        ends.append(len(raw))
        kinds.append(kind)
    out, start, seg = [], 0, 0
    for _, end in token_spans(raw):
        while ends[seg] < end:
            seg += 1
        out.append(Piece(kinds[seg], raw[start:end]))
        start = end
    return out


def complete(
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    effort: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    answer: Sequence[str] | None = None,
    state_tag: bytes = b"",
    thinks: bool = True,
) -> Completion:
    """The completion for a conversation: past its natural end with ignore_eos or min_tokens, cut at max_tokens;
    `answer` replaces the answer's words (recalled facts), `state_tag` names a wrong KDA state (other words); without
    `thinks` there is no think block (guided decoding constrains the output from its first token)."""
    seed = json.dumps([messages, tools, tool_choice, effort], sort_keys=True, default=str).encode() + state_tag
    last = messages[-1] if messages else {}
    asked = message_text(last.get("content"))
    words = EFFORT_REASONING_WORDS.get(effort or DEFAULT_EFFORT, EFFORT_REASONING_WORDS[DEFAULT_EFFORT])
    verb = "The tool returned:" if last.get("role") == "tool" else "The user asks:"
    reasoning = _fit([*verb.split(), *_words(asked)[:12]], words, seed + b"r")
    fn = wanted_tool(messages, tools, tool_choice)
    think: list[tuple[Kind, str]] = [("think", THINK_OPEN), ("reasoning", f" {reasoning}"), ("think", f" {THINK_CLOSE}")]
    pieces = _pieces([*(think if thinks else []), *_tail(fn, asked, seed, answer)])
    wanted = max(min_tokens, max_tokens if ignore_eos and max_tokens is not None else 0)
    if wanted > len(pieces):  # EOS suppressed: the answer goes on
        pieces += [Piece("content", f" {w}") for w in _filler(seed + b"x", wanted - len(pieces))]
    finish = "stop"
    if max_tokens is not None and 0 <= max_tokens < len(pieces) or (ignore_eos and len(pieces) == max_tokens):
        pieces, finish = pieces[: max(max_tokens or 0, 0)], "length"
    return Completion(pieces=tuple(pieces), finish_reason=finish)
