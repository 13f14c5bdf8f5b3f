"""One streamed chat completion as the stages see it: what arrived, when, and the usage block, from its SSE events.

Both engines stream OpenAI chunks; the split-off reasoning is `reasoning_content` (SGLang) or `reasoning`
(vLLM). `cached_tokens` is read from `usage.prompt_tokens_details` (or SGLang's older top-level field) and is
None when the engine did not say: unknown is not zero.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StreamRecord:
    """Everything one streamed request produced (times in seconds after it was sent)."""

    content_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    deltas: list[str] = field(default_factory=list)  # every text delta in order: the tokens, as text
    token_times_s: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    first_answer_s: float | None = None  # first content (not reasoning) token
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    latency_s: float = 0.0

    @property
    def content(self) -> str:
        """The answer text."""
        return "".join(self.content_parts)

    @property
    def reasoning(self) -> str:
        """The split-off reasoning text."""
        return "".join(self.reasoning_parts)

    @property
    def ttft_s(self) -> float | None:
        """Time to the first token of any kind (reasoning included)."""
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def prompt_tokens(self) -> int | None:
        """usage.prompt_tokens (None without a usage block)."""
        return _int(self.usage, "prompt_tokens")

    @property
    def completion_tokens(self) -> int | None:
        """usage.completion_tokens, else the text chunks counted (one token each)."""
        return _int(self.usage, "completion_tokens") if self.usage else len(self.deltas) or None

    @property
    def reasoning_tokens(self) -> int | None:
        """usage.completion_tokens_details.reasoning_tokens when reported."""
        details = (self.usage or {}).get("completion_tokens_details") or {}
        return _int(details, "reasoning_tokens")

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens served from the prefix cache; None when the engine does not report them."""
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        value = _int(details, "cached_tokens")
        return value if value is not None else _int(usage, "cached_tokens")

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive text chunks."""
        return [b - a for a, b in itertools.pairwise(self.token_times_s)]


def _int(obj: Any, key: str) -> int | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def add_event(rec: StreamRecord, t_s: float, data: str) -> None:
    """Fold one SSE `data:` payload into the record (called per token: kept lean)."""
    rec.latency_s = t_s
    if data == "[DONE]":
        return
    try:
        chunk = json.loads(data)
    except ValueError:
        rec.error = f"not JSON in the stream: {data[:120]!r}"
        return
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        rec.usage = usage  # vLLM's continuous usage repeats it: the last one (the full block) counts
    if "error" in chunk or chunk.get("object") == "error":
        err = chunk.get("error", chunk)
        rec.error = str(err.get("message", err) if isinstance(err, dict) else err)[:300]
        return
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        if delta:
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                rec.reasoning_parts.append(thought)
                rec.deltas.append(thought)
                rec.token_times_s.append(t_s)
            text = delta.get("content")
            if text:
                rec.content_parts.append(text)
                rec.deltas.append(text)
                rec.token_times_s.append(t_s)
                if rec.first_answer_s is None:
                    rec.first_answer_s = t_s
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]


def record(events: Iterable[tuple[float, str]]) -> StreamRecord:
    """A record from (seconds, data) pairs."""
    rec = StreamRecord()
    for t_s, data in events:
        add_event(rec, t_s, data)
    return rec
