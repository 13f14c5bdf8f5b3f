"""The kimi_k3 parsers as the engines run them while streaming: one generated token in, at most one delta out.

With the reasoning parser, the think block's text goes to `reasoning_content` (SGLang) or `reasoning`
(vLLM) and its markers vanish; without it they stay in `content`, raw. With the tool parser, a call's id
token opens a `tool_calls` delta (index, id, type, name, empty arguments) and each argument token adds a
fragment; without it the section stays in `content`, raw. The non-streamed message is what the deltas add
up to, so streamed and non-streamed answers never differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from k3deploy.sim.generation import Completion, Piece


@dataclass
class ChatParser:
    """Turns pieces into chat deltas and remembers the message they add up to."""

    reasoning_key: str
    reasoning_parser: bool
    tool_parser: bool
    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def delta(self, piece: Piece) -> dict[str, Any] | None:
        """The delta for one token, or None when a parser swallows it (a marker)."""
        kind, text = piece.kind, piece.text
        if self.reasoning_parser and kind == "think":
            return None
        if self.reasoning_parser and kind == "reasoning":
            text = text if self.reasoning else text.lstrip()
            self.reasoning += text
            return {self.reasoning_key: text}
        if self.tool_parser and kind == "tool_marker":
            return None
        if self.tool_parser and kind == "tool_id":
            name = text.strip().split(".", 1)[-1].rsplit(":", 1)[0]
            call: dict[str, Any] = {
                "index": len(self.calls),
                "id": text.strip(),
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            self.calls.append(call)
            return {"tool_calls": [call | {"function": dict(call["function"])}]}
        if self.tool_parser and kind == "tool_args" and self.calls:
            call = self.calls[-1]
            text = text if call["function"]["arguments"] else text.lstrip()
            call["function"]["arguments"] += text
            return {"tool_calls": [{"index": call["index"], "function": {"arguments": text}}]}
        text = text if self.content else text.lstrip()
        self.content += text
        return {"content": text}

    def finish_reason(self, done: Completion) -> str:
        """`tool_calls` when the parser produced calls and the model stopped by itself."""
        return "tool_calls" if self.calls and done.finish_reason == "stop" else done.finish_reason

    def message(self, mimic: str) -> dict[str, Any]:
        """The assistant message the deltas so far add up to."""
        calls = [{k: v for k, v in c.items() if k != "index"} for c in self.calls]
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None,
                                   self.reasoning_key: self.reasoning or None}
        # SGLang leaves the field null when there are none; vLLM drops an empty list (its ChatMessage
        # serializer, vllm/entrypoints/openai/chat_completion/protocol.py).
        if calls or mimic == "sglang":
            message["tool_calls"] = calls or None
        if mimic == "vllm":  # the OpenAI fields vLLM's ChatMessage always carries, null here
            message |= {"refusal": None, "annotations": None, "audio": None, "function_call": None}
        return message


@dataclass(frozen=True)
class Frame:
    """What every chunk of one response shares."""

    head: dict[str, Any]
    chunk_object: str

    def chat(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        """One chat.completion.chunk."""
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**self.head, "object": self.chunk_object, "choices": [choice]}

    def text(self, text: str, finish: str | None = None) -> dict[str, Any]:
        """One text_completion chunk."""
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self.head, "object": self.chunk_object, "choices": [choice]}

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The closing usage chunk (no choices)."""
        return {**self.head, "object": self.chunk_object, "choices": [], "usage": usage}


def stream_flags(body: dict[str, Any], mimic: str) -> tuple[bool, bool]:
    """(include_usage, continuous usage on every chunk); the second is vLLM's and needs the first."""
    opts = body.get("stream_options") or {}
    usage = bool(opts.get("include_usage"))
    return usage, usage and mimic == "vllm" and bool(opts.get("continuous_usage_stats"))
