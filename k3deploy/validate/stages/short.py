"""Stage `short`: a chat request, a tool-call request and a structured-output request, each streamed and not,
through rank 0's API: reasoning split from content (the reasoning parser ran), structured tool_calls whose
arguments validate against the tool's JSON Schema (the tool parser ran), content valid against the
`response_format` JSON schema (the engine's guided decoding ran: vLLM's structured outputs and SGLang's grammar
backend apply it to the answer after the reasoning), and finish_reason as the OpenAI API defines it."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from k3deploy.executors.http import NodeHttp
from k3deploy.validate import reach
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.kernels import family_of

CHAT_PATH = "/v1/chat/completions"
# K3's control tokens are spelled <|name|> (think markers <|open|>think<|sep|> ... <|close|>think<|sep|>, the
# tool-call section markers); other models' <think> tags too. None of them belongs in an answer's content.
RAW_MARKERS = re.compile(r"<\|[a-z_]+\|>|</?think>")
REASONING_KEY = {"sglang": "reasoning_content", "vllm": "reasoning"}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}, "country": {"type": "string", "minLength": 1},
                   "population_millions": {"type": "number", "minimum": 0}},
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
STRUCTURED_QUESTION = "Name one large city, its country and its population in millions."
CHAT_QUESTION = "In one sentence, what does a prefix cache save?"
TOOL_QUESTION = "Use the get_weather tool: what is the weather in Paris, in celsius?"


@dataclass
class Answer:
    """One response, streamed or not, as the message it adds up to."""

    content: str = ""
    reasoning: dict[str, str] = field(default_factory=dict)  # key -> text, under whichever key the engine used
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, part: dict[str, Any]) -> None:
        """Add a message or a delta."""
        self.content += part.get("content") or ""
        for key in REASONING_KEY.values():
            if part.get(key):
                self.reasoning[key] = self.reasoning.get(key, "") + part[key]
        for i, call in enumerate(part.get("tool_calls") or []):
            slot = self.calls.setdefault(int(call.get("index", i)), {"id": "", "type": "", "name": "", "arguments": ""})
            fn = call.get("function") or {}
            slot["id"] = slot["id"] or call.get("id") or ""
            slot["type"] = slot["type"] or call.get("type") or ""
            slot["name"] = slot["name"] or fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""


def ask(http: NodeHttp, body: dict[str, Any], stream: bool, timeout_s: float) -> tuple[Answer, str]:
    """Send one chat request; the answer and a one-line excerpt of what came back."""
    answer = Answer()
    if not stream:
        reply = http.post(CHAT_PATH, body, timeout_s)
        if not reply.ok:
            raise ValueError(f"HTTP {reply.status}: {reply.text[:300]}")
        choice = reply.json()["choices"][0]
        answer.add(choice.get("message") or {})
        answer.finish_reason = choice.get("finish_reason")
        return answer, json.dumps(choice.get("message"))[:400]
    for event in http.stream(CHAT_PATH, {**body, "stream": True}, timeout_s):
        if event.data == "[DONE]":
            break
        for choice in json.loads(event.data).get("choices") or []:
            answer.add(choice.get("delta") or {})
            answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
    return answer, json.dumps({"content": answer.content[:120], "reasoning": answer.reasoning and
                               {k: v[:80] for k, v in answer.reasoning.items()}, "tool_calls": list(answer.calls.values()),
                               "finish_reason": answer.finish_reason})[:400]


def reasoning_problems(answer: Answer, key: str) -> list[str]:
    """The reasoning parser ran: reasoning under the engine's key, no raw markers in content."""
    out = []
    leaked = sorted(set(RAW_MARKERS.findall(answer.content)))
    if leaked:
        out.append(f"raw markers in content ({', '.join(leaked)}): is the reasoning/tool parser running?")
    other = [k for k in answer.reasoning if k != key]
    if key not in answer.reasoning:
        where = f" (found under {other[0]!r})" if other else ""
        out.append(f"no reasoning in `{key}`{where}: the reasoning parser did not split it off")
    return out


def chat_problems(answer: Answer, key: str | None, budget: int) -> list[str]:
    """A plain chat answer: reasoning split off (key None: the model has no reasoning parser), some content,
    finish_reason stop."""
    out = reasoning_problems(answer, key) if key else []
    if not answer.content.strip():
        out.append("empty content")
    if answer.finish_reason != "stop":
        out.append(f"finish_reason {answer.finish_reason!r}, expected 'stop'"
                   + (f" (raise validate.short_max_tokens, {budget}?)" if answer.finish_reason == "length" else ""))
    return out


def tool_problems(answer: Answer, key: str | None, tool: dict[str, Any]) -> list[str]:
    """A tool-call answer: structured tool_calls naming the tool, arguments valid per its schema."""
    from jsonschema import Draft202012Validator

    out = reasoning_problems(answer, key) if key else []
    fn = tool["function"]
    if not answer.calls:
        out.append("no structured tool_calls: the tool-call parser did not run")
    for index, call in sorted(answer.calls.items()):
        where = f"tool_calls[{index}]"
        if call["type"] != "function" or not call["id"]:
            out.append(f"{where}: type {call['type']!r}, id {call['id']!r} (expected type 'function' and an id)")
        if call["name"] != fn["name"]:
            out.append(f"{where}: calls {call['name']!r}, expected {fn['name']!r}")
        try:
            args = json.loads(call["arguments"])
        except ValueError as exc:
            out.append(f"{where}: arguments are not JSON ({exc}): {call['arguments'][:200]!r}")
            continue
        errors = sorted(Draft202012Validator(fn["parameters"]).iter_errors(args), key=lambda e: list(e.path))
        out += [f"{where}: arguments {json.dumps(args)} break the schema: {e.message}" for e in errors]
    if answer.finish_reason != "tool_calls":
        out.append(f"finish_reason {answer.finish_reason!r}, expected 'tool_calls'")
    return out


def structured_problems(answer: Answer, key: str | None, schema: dict[str, Any]) -> list[str]:
    """A response_format answer: content that is JSON valid against the schema, finish_reason stop."""
    from jsonschema import Draft202012Validator

    out = reasoning_problems(answer, key) if key else []
    try:
        value = json.loads(answer.content)
    except ValueError as exc:
        out.append(f"content is not JSON ({exc}): {answer.content[:200]!r}: the response_format JSON schema was not "
                   "applied (is the engine's structured output / grammar backend on?)")
    else:
        errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
        out += [f"content {json.dumps(value)[:200]} breaks the response_format schema: {e.message}" for e in errors]
    if answer.finish_reason != "stop":
        out.append(f"finish_reason {answer.finish_reason!r}, expected 'stop'")
    return out


class ShortStage:
    """A chat, a tool call and a structured output, streamed and not."""

    name = "short"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """Four requests through rank 0's API."""
        parsers = ctx.model.parsers
        # A model whose catalog entry names no parser is rendered without it: nothing to split or structure.
        key = REASONING_KEY[family_of(ctx)] if parsers.reasoning_parser else None
        asks = ("chat", "tool call", "structured output") if parsers.tool_call_parser else ("chat", "structured output")
        timeout_s = ctx.topology.validate_.request_timeout_s
        problems: list[str] = []
        seen: list[str] = []
        with reach.rank0_http(ctx, timeout_s) as http:
            budget = ctx.topology.validate_.short_max_tokens
            base = {"model": served_model(http, ctx.topology.model.id), "max_tokens": budget, "temperature": 0,
                    "reasoning_effort": "low"}
            chat = {**base, "messages": [{"role": "user", "content": CHAT_QUESTION}]}
            tool = {**base, "messages": [{"role": "user", "content": TOOL_QUESTION}], "tools": [TOOL],
                    "tool_choice": "auto"}
            structured = {**base, "messages": [{"role": "user", "content": STRUCTURED_QUESTION}],
                          "response_format": RESPONSE_FORMAT}
            for what, body in ((w, {"chat": chat, "tool call": tool, "structured output": structured}[w]) for w in asks):
                for stream in (False, True):
                    label = f"{what} ({'streamed' if stream else 'not streamed'})"
                    try:
                        answer, excerpt = ask(http, body, stream, timeout_s)
                    except (ValueError, KeyError, IndexError) as exc:
                        problems.append(f"{label}: {exc}")
                        continue
                    found = (chat_problems(answer, key, budget) if what == "chat" else
                             tool_problems(answer, key, TOOL) if what == "tool call" else
                             structured_problems(answer, key, SCHEMA))
                    problems += [f"{label}: {p}" for p in found]
                    if found or not seen:
                        seen.append(f"{label}: {excerpt}")
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return StageResult(name=self.name, status="fail", detail=problems[0] + more,
                               evidence="\n".join(problems + seen))
        return StageResult(name=self.name, status="pass", evidence="\n".join(seen), detail=_passed(key, asks))


def _passed(key: str | None, asks: tuple[str, ...]) -> str:
    """What a passing run showed, and what the model's catalog entry left out."""
    tools = "tool call" in asks
    if key and tools:
        return (f"chat, tool call and structured output, streamed and not: reasoning in `{key}`, tool_calls valid "
                "per the schema, content valid per the response_format schema, finish_reason stop / tool_calls")
    shown = "chat, tool call and structured output" if tools else "chat and structured output"
    return (f"{shown}, streamed and not: " + (f"reasoning in `{key}`, " if key else "")
            + ("tool_calls valid per the schema, " if tools else "") + "content valid per the response_format "
            "schema, finish_reason as expected; not "
            + " nor ".join(w for w, on in (("the reasoning split", not key), ("tool calls", not tools)) if on)
            + ": the model's catalog entry names no such parser")


def served_model(http: NodeHttp, default: str) -> str:
    """The name rank 0 serves the model under (/v1/models), else the model id the renderers pass."""
    reply = http.get("/v1/models")
    try:
        return str(reply.json()["data"][0]["id"]) if reply.ok else default
    except (ValueError, KeyError, IndexError, TypeError):
        return default
