"""Greedy streamed chat requests to rank 0 for the request stages, in the engine's own dialect (effort fields,
how to ask without the prefix cache, the flag that turns cached-token reporting on)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from k3deploy.errors import ExecError
from k3deploy.validate.streamed import StreamRecord, add_event

if TYPE_CHECKING:
    from k3deploy.executors.http import NodeHttp
    from k3deploy.validate.stage import ValidateContext

FLUSH_ATTEMPTS = 3
FLUSH_RETRY_S = 0.5
CACHE_REPORT_FLAG = {"sglang": "--enable-cache-report", "vllm": "--enable-prompt-tokens-details"}
PREFIX_CACHE_FLAG = {"sglang": "SGLang caches unless --disable-radix-cache", "vllm": "vLLM needs --enable-prefix-caching"}


def dialect(ctx: ValidateContext) -> str:
    """sglang | vllm: whose API rank 0 speaks (vLLM-Ascend is vLLM; the stand-in says whom it mimics)."""
    engine = ctx.topology.engine
    kind = getattr(engine, "mimic", None) if engine.kind == "sim" else engine.kind
    return "sglang" if kind == "sglang" else "vllm"


def effort_fields(effort: str, via: str) -> dict[str, Any]:
    """The request fields asking K3 for a reasoning effort: top-level, or through the chat template."""
    if via == "chat_template_kwargs":
        return {"chat_template_kwargs": {"thinking": True, "thinking_effort": effort}}
    return {"reasoning_effort": effort}


def effort_via(ctx: ValidateContext) -> str:
    """The topology's choice, else SGLang's cookbook form for SGLang and Moonshot's verifier form for vLLM."""
    via = ctx.topology.validate_.effort_via
    if via != "auto":
        return via
    return "reasoning_effort" if dialect(ctx) == "sglang" else "chat_template_kwargs"


class Chat:
    """Requests to one deployment's rank 0 (greedy, streamed, usage included)."""

    def __init__(self, http: NodeHttp, ctx: ValidateContext) -> None:
        self.http, self.ctx = http, ctx
        self.dialect = dialect(ctx)
        self.timeout_s = ctx.topology.validate_.request_timeout_s
        self._model: str | None = None

    @property
    def model(self) -> str:
        """The served model name, as /v1/models lists it (the catalog id when it does not answer)."""
        if self._model is None:
            self._model = self.ctx.topology.model.id
            try:
                reply = self.http.get("/v1/models", 10.0)
                data = reply.json().get("data") if reply.ok else None
                if data:
                    self._model = str(data[0]["id"])
            except (ExecError, ValueError, KeyError, TypeError, AttributeError):
                pass  # asked with the catalog id; the engine's error says if that is wrong
        return self._model

    def body(self, messages: Sequence[dict[str, Any]], max_tokens: int, **extra: Any) -> dict[str, Any]:
        """A greedy streamed request body with usage."""
        return {"model": self.model, "messages": list(messages), "stream": True, "temperature": 0,
                "max_tokens": max_tokens, "stream_options": {"include_usage": True}, **extra}

    def ask(self, messages: Sequence[dict[str, Any]], max_tokens: int, **extra: Any) -> StreamRecord:
        """One request for messages (see send)."""
        return self.send(self.body(messages, max_tokens, **extra))

    def count(self, messages: Sequence[dict[str, Any]]) -> int | str:
        """The prompt tokens of messages as a chat request would have them, by the engine's own tokenizer:
        vLLM's /tokenize (no generation, so no context limit), else a 1-token request's usage; or the error."""
        if self.dialect == "vllm":
            try:
                reply = self.http.post("/tokenize", {"model": self.model, "messages": list(messages)}, self.timeout_s)
                count = reply.json().get("count") if reply.ok else None
                if isinstance(count, int):
                    return count
            except (ExecError, ValueError, AttributeError):
                pass  # counted by a request below, whose error is the one to show
        rec = self.ask(messages, 1)
        if rec.error is not None:
            return rec.error
        return rec.prompt_tokens if rec.prompt_tokens is not None else "the answer has no usage.prompt_tokens"

    def send(self, body: dict[str, Any]) -> StreamRecord:
        """One request; an HTTP error or a broken stream is the record's error, never an exception."""
        rec = StreamRecord()
        try:
            for event in self.http.stream("/v1/chat/completions", body, self.timeout_s):
                add_event(rec, event.t_s, event.data)
        except ExecError as exc:
            rec.error = str(exc)
        if rec.error is None and rec.usage is None:
            rec.error = "the stream ended without a usage block (stream_options.include_usage was asked)"
        return rec

    def cold(self, messages: Sequence[dict[str, Any]], max_tokens: int, **extra: Any) -> tuple[StreamRecord | None, str]:
        """The same request again with no cache to hit: (record or None, how it was made cold, or why it was not).

        vLLM: a fresh per-request `cache_salt` (no flush: the cached prefixes of other users stay, and vLLM's
        /reset_prefix_cache exists only in its development mode); SGLang: POST /flush_cache first."""
        if self.dialect == "vllm":
            how = "cache-salted"
            return self.ask(messages, max_tokens, cache_salt=f"k3deploy-validate-{uuid.uuid4().hex}", **extra), how
        for attempt in range(FLUSH_ATTEMPTS):  # SGLang refuses while any request runs (other users' too)
            if attempt:
                time.sleep(FLUSH_RETRY_S)
            try:
                reply = self.http.post("/flush_cache", None, 30.0)
            except ExecError as exc:
                return None, f"POST /flush_cache: {exc}"
            if reply.ok:
                return self.ask(messages, max_tokens, **extra), "after POST /flush_cache"
        busy = " (SGLang flushes only while no request runs: validate when the server is idle)" \
            if reply.status == 400 else ""
        return None, f"POST /flush_cache: HTTP {reply.status} after {FLUSH_ATTEMPTS} tries{busy}"
