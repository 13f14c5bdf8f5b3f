"""OpenAI chat completions as the mimicked engine answers them: validation, prefix cache, usage, streaming."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from k3deploy.sim.admission import Admission
from k3deploy.sim.generation import Completion, ParsedMessage, complete, parse
from k3deploy.sim.log_format import EngineLog
from k3deploy.sim.metrics import ServingStats
from k3deploy.sim.prefix_cache import PrefixCache
from k3deploy.sim.serve_config import ServeConfig
from k3deploy.sim.tokens import render_prompt, token_ids, token_spans

State = Literal["starting", "ready", "stalled", "dead"]
HASH_BLOCK_TOKENS = 512  # K3's documented fine hash block; 12 of them make one physical block
PHYSICAL_BLOCKS_PER_PAGE = 12
STREAM_PIECE_TOKENS = 8
# A head stuck in a collective never answers; the stand-in gives up after this long so tests end.
STALL_S = 600.0


class ApiError(Exception):
    """An HTTP error the engine would return, with its status and OpenAI error type."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class ChatReply:
    """A finished completion: the JSON body, and the SSE chunks when the client asked to stream."""

    body: dict[str, Any]
    chunks: list[dict[str, Any]] | None


class ChatService:
    """The head's request path; thread-safe (the HTTP server runs one thread per connection)."""

    def __init__(self, cfg: ServeConfig, admission: Admission, log: EngineLog) -> None:
        self.cfg = cfg
        self.admission = admission
        self.log = log
        self.state: State = "starting"
        block = cfg.prefix_match_unit or HASH_BLOCK_TOKENS
        self.cache: PrefixCache[None] = PrefixCache(
            hash_block_tokens=block,
            physical_block_tokens=block * PHYSICAL_BLOCKS_PER_PAGE,
            capacity_tokens=max(admission.budget.kv_tokens, block * PHYSICAL_BLOCKS_PER_PAGE),
            enabled=cfg.prefix_cache,
        )
        self.stats = ServingStats(
            kv_total_tokens=max(admission.budget.kv_tokens, 1),
            state_slots_total=max(admission.budget.state_requests, 1),
        )
        self._cond = threading.Condition()
        self._never = threading.Event()
        self._serial = 0

    @property
    def reasoning_key(self) -> str:
        """Where the split-off reasoning goes: SGLang `reasoning_content`, vLLM `reasoning`."""
        return "reasoning_content" if self.cfg.mimic == "sglang" else "reasoning"

    def error_body(self, err: ApiError) -> dict[str, Any]:
        """The engine's JSON error envelope."""
        if self.cfg.mimic == "sglang":
            return {
                "object": "error",
                "message": err.message,
                "type": err.kind,
                "param": None,
                "code": err.status,
            }
        return {"error": {"message": err.message, "type": err.kind, "param": None, "code": err.status}}

    def models(self) -> dict[str, Any]:
        """The /v1/models body."""
        owner = "sglang" if self.cfg.mimic == "sglang" else "vllm"
        return {
            "object": "list",
            "data": [
                {
                    "id": self.cfg.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": owner,
                    "root": self.cfg.model_path,
                    "parent": None,
                    "max_model_len": self.admission.context_length,
                }
            ],
        }

    def _check_alive(self) -> None:
        if self.state == "starting":
            raise ApiError(503, "The server is starting up.", "ServiceUnavailableError")
        if self.state == "dead":
            raise ApiError(
                500,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "EngineDeadError",
            )
        if self.state == "stalled":  # as the real head stuck in a collective: the request never finishes
            self._never.wait(STALL_S)
            raise ApiError(503, "The engine stopped making progress.", "ServiceUnavailableError")

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int) -> int:
        ctx = self.admission.context_length
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        if self.cfg.mimic == "sglang":
            limit = min(ctx - 1, self.admission.budget.kv_tokens - 1)
            if prompt_tokens > limit:
                raise ApiError(
                    400,
                    f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
                    f"({limit} tokens). Use a shorter input or enable --allow-auto-truncate.",
                )
            return min(int(asked), ctx - prompt_tokens) if asked else ctx - prompt_tokens
        if prompt_tokens >= ctx:
            raise ApiError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            )
        if asked and prompt_tokens + int(asked) > ctx:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {asked}. This model's "
                f"maximum context length is {ctx} tokens and your request has {prompt_tokens} input "
                f"tokens ({asked} > {ctx} - {prompt_tokens}).",
            )
        return int(asked) if asked else ctx - prompt_tokens

    def _validate(self, body: Any) -> tuple[list[dict[str, Any]], Any, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise ApiError(400, "messages: Field required (a non-empty list of chat messages)")
        model = body.get("model")
        if (
            self.cfg.mimic == "vllm"
            and model
            and model not in (self.cfg.served_model_name, self.cfg.model_path)
        ):
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        tools = body.get("tools") or None
        # vLLM (and the OpenAI API) default tool_choice to auto when tools are given.
        choice = body.get("tool_choice", "auto" if tools else "none")
        if (
            self.cfg.mimic == "vllm"
            and tools
            and choice == "auto"
            and not (self.cfg.auto_tool_choice and self.cfg.tool_parser)
        ):
            raise ApiError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        return body["messages"], tools, choice

    def chat(self, body: Any) -> ChatReply:
        """Answer one /v1/chat/completions request (raises ApiError like the engine would)."""
        self._check_alive()
        messages, tools, choice = self._validate(body)
        prompt = render_prompt(messages, tools if choice != "none" else None)
        n_prompt = len(prompt.ids)
        max_tokens = self._max_tokens(body, n_prompt)
        effort = body.get("reasoning_effort") or (body.get("chat_template_kwargs") or {}).get(
            "reasoning_effort"
        )
        with self._cond:
            self.stats.queued += 1
            self._cond.wait_for(
                lambda: self.stats.running < self.admission.max_running_requests, timeout=STALL_S
            )
            self.stats.queued -= 1
            self.stats.running += 1
            cached = (
                min(self.cache.lookup(prompt.ids).hit_tokens, n_prompt - 1) if self.cfg.prefix_cache else 0
            )
        try:
            done = complete(messages, tools=tools, tool_choice=choice, effort=effort, max_tokens=max_tokens)
            # A required or named tool_choice runs guided decoding, which returns the call structured
            # whatever the tool parser; `auto` relies on the kimi_k3 parser.
            guided = choice == "required" or isinstance(choice, dict)
            parsed = parse(
                done,
                reasoning_parser=self.cfg.reasoning_parser == "kimi_k3",
                tool_parser=self.cfg.tool_calls_structured or guided,
            )
        finally:
            with self._cond:
                self.stats.running -= 1
                self._cond.notify()
        return self._finish(body, prompt.ids, prompt.boundaries, cached, done, parsed)

    def _finish(
        self,
        body: dict[str, Any],
        ids: list[int],
        boundaries: list[int],
        cached: int,
        done: Completion,
        parsed: ParsedMessage,
    ) -> ChatReply:
        full = ids + token_ids(done.raw)
        with self._cond:
            self.cache.insert(full, turn_boundaries=[*boundaries, len(full)])
            s = self.stats
            s.requests += 1
            s.prompt_tokens += len(ids)
            s.generation_tokens += done.tokens
            s.cached_tokens += cached
            s.cache_queries += len(ids) if self.cfg.prefix_cache else 0
            s.kv_used_tokens = self.cache.used_tokens
            self._serial += 1
            serial = self._serial
        if self.cfg.mimic == "sglang":
            self.log.info(
                f"Prefill batch. #new-seq: 1, #new-token: {len(ids) - cached}, #cached-token: {cached}, "
                f"token usage: {s.kv_used_tokens / s.kv_total_tokens:.2f}, #running-req: {s.running}, "
                f"#queue-req: {s.queued}"
            )
        usage: dict[str, Any] = {
            "prompt_tokens": len(ids),
            "completion_tokens": done.tokens,
            "total_tokens": len(ids) + done.tokens,
            "completion_tokens_details": {"reasoning_tokens": done.reasoning_tokens},
            "prompt_tokens_details": {"cached_tokens": cached} if self.cfg.cache_report else None,
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:24]
        head = {
            "id": f"chatcmpl-{digest}{serial:04x}",
            "created": int(time.time()),
            "model": self.cfg.served_model_name,
        }
        message: dict[str, Any] = {
            "role": "assistant",
            "content": parsed.content,
            self.reasoning_key: parsed.reasoning,
        }
        calls = [{k: v for k, v in c.items() if k != "index"} for c in parsed.tool_calls or []]
        message["tool_calls"] = calls if calls else ([] if self.cfg.mimic == "vllm" else None)
        reply = {
            **head,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": parsed.finish_reason}
            ],
            "usage": usage,
        }
        chunks = self._chunks(head, parsed, usage, body) if body.get("stream") else None
        return ChatReply(body=reply, chunks=chunks)

    def _chunks(
        self, head: dict[str, Any], parsed: ParsedMessage, usage: dict[str, Any], body: dict[str, Any]
    ) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                **head,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }

        out = [chunk({"role": "assistant", "content": ""})]
        for key, text in ((self.reasoning_key, parsed.reasoning), ("content", parsed.content)):
            starts = [a for a, _ in token_spans(text or "")][::STREAM_PIECE_TOKENS]
            for a, b in zip(starts, [*starts[1:], len(text or "")], strict=True):
                out.append(chunk({key: (text or "")[a if a != starts[0] else 0 : b]}))
        if parsed.tool_calls:
            out.append(chunk({"tool_calls": parsed.tool_calls}))
        out.append(chunk({}, parsed.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return out
