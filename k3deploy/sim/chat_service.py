"""OpenAI chat and text completions as the mimicked engine answers them: validation, limits, effort,
parsers and streams that never break (the engine core paces the tokens)."""

from __future__ import annotations

import time
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from k3deploy.sim.engine_core import STALL_S, EngineCore, Job
from k3deploy.sim.generation import Completion, complete
from k3deploy.sim.images import ImageError, image_limit, resolve_images
from k3deploy.sim.peer_loss import DEAD_MESSAGE, engine_death
from k3deploy.sim.recall import Facts, recall_answer, state_view
from k3deploy.sim.stream import ChatParser, Frame, stream_flags
from k3deploy.sim.structured import FormatError, structured_answer
from k3deploy.sim.tokens import message_text, render_prompt, token_ids

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # /v1/completions' max_tokens default in the OpenAI API and both engines


class ApiError(Exception):
    """An HTTP error the engine would return, with its status and OpenAI error type."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


def validation_error(message: str, param: str, value: Any) -> ApiError:
    """vLLM's VLLMValidationError as its API answers it: the message ends with the parameter and value
    (vllm/exceptions.py), and `param` names it."""
    return ApiError(400, f"{message} (parameter={param}, value={value})", param=param)


@dataclass(frozen=True)
class Reply:
    """A JSON body, or SSE chunks produced as the tokens come out when the client asked to stream."""

    body: dict[str, Any] | None = None
    chunks: Generator[dict[str, Any], None, None] | None = None
    cached: int = 0  # a whole reply's prefix-cache hit, reported or not (a vLLM PD prefill passes it on)


class ChatService(EngineCore):
    """The head's OpenAI API: chat and text completions, the models list, errors as the engine words them."""

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
        return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.status}}

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
        if self.state == "peer_lost":  # vLLM finds a lost node only at its next collective (peer_loss.py)
            with self._cond:
                first, self.state = self.state == "peer_lost", "dead"
            if first and self.lost_peer is not None:
                engine_death(self.log, self.lost_peer)
                self.on_death()
        if self.state == "dead":
            # vLLM 0.32.0's body for an EngineDeadError (seen by tests/realengine/test_health_peer_gone.py).
            raise ApiError(500, DEAD_MESSAGE, "InternalServerError")
        if self.state == "stalled":  # as the real head stuck in a collective: the request never finishes
            self._never.wait(STALL_S)
            raise ApiError(503, "The engine stopped making progress.", "ServiceUnavailableError")

    def _max_tokens(self, body: dict[str, Any], prompt_tokens: int, default: int | None = None) -> int:
        ctx = self.admission.context_length
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or default
        if self.cfg.mimic == "sglang":
            limit = min(ctx - 1, self.admission.budget.kv_tokens - 1)
            if prompt_tokens > limit:
                raise ApiError(
                    400,
                    f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
                    f"({limit} tokens). Use a shorter input or enable --allow-auto-truncate.",
                )
            return min(int(asked), ctx - prompt_tokens) if asked else ctx - prompt_tokens
        # vLLM 0.32.0 (vllm/renderers/params.py, entrypoints/serve/utils/api_utils.py get_max_tokens): a
        # prompt past the context and max_tokens past it are refused; otherwise max_tokens is clamped to the
        # room the prompt leaves. (A prompt of exactly the context leaves none: refused here too.)
        if prompt_tokens >= ctx:
            # vLLM tokenizes at most context + 1 tokens (renderers/params.py get_encode_kwargs), so a longer
            # prompt is reported as "at least" that many (_token_len_check).
            seen = min(prompt_tokens, ctx + 1)
            qualifier = "at least " if seen == ctx + 1 else ""
            raise validation_error(
                f"This model's maximum context length is {ctx} tokens. However, your prompt contains "
                f"{qualifier}{seen} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.", "input_tokens", seen)
        if asked and int(asked) > ctx:
            raise validation_error(f"max_tokens={asked} cannot be greater than max_model_len={ctx}. Please "
                                   "request fewer output tokens.", "max_tokens", asked)
        return min(int(asked), ctx - prompt_tokens) if asked else ctx - prompt_tokens

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if (
            self.cfg.mimic == "vllm"
            and model
            and model not in (self.cfg.served_model_name, self.cfg.model_path)
        ):
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {self.cfg.served_model_name}.",
                           "NotFoundError", "model")

    def _validate(self, body: Any) -> tuple[list[dict[str, Any]], Any, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise ApiError(400, "messages: Field required (a non-empty list of chat messages)")
        self._check_model(body)
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

    def _job_args(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Job fields a body sets: vLLM's `cache_salt` (V1's rule: a non-empty string when given)."""
        salt = body.get("cache_salt")
        if self.cfg.mimic != "vllm" or salt is None:
            return {}
        if not isinstance(salt, str) or not salt:
            raise ApiError(400, "Parameter 'cache_salt' must be a non-empty string if provided.")
        return {"salt": salt}

    def _generation(self, body: dict[str, Any], n_prompt: int,
                    default_max: int | None = None) -> dict[str, Any]:
        """complete()'s length and effort arguments, read the ways the engines accept them."""
        max_tokens = self._max_tokens(body, n_prompt, default_max)
        min_tokens = int(body.get("min_tokens") or 0)
        if self.cfg.mimic == "vllm" and min_tokens > max_tokens:
            raise ApiError(
                400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
            )
        kwargs = body.get("chat_template_kwargs") or {}
        # Top-level reasoning_effort (SGLang cookbook) or the chat template's thinking_effort (Moonshot's
        # vendor verifier); K3's template thinks at max effort when neither is given.
        effort = (
            body.get("reasoning_effort") or kwargs.get("thinking_effort") or kwargs.get("reasoning_effort")
        )
        return {
            "max_tokens": max_tokens,
            "min_tokens": min_tokens,
            "ignore_eos": bool(body.get("ignore_eos")),
            "effort": effort,
        }

    def _received(self, body: dict[str, Any], ids: list[int], text: str, asked: str) -> tuple[Facts | None, int]:
        """A decode's transferred state: the facts it holds and the prompt tokens it got (None, 0: computed here)."""
        return None, 0

    def _inputs(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
        """The messages with their images read and priced (the image_dropped fault leaves them out), and the JSON
        the answer must be under response_format (the schema_ignored fault: none)."""
        try:
            seen, _ = resolve_images(messages, self.vision, image_limit(self.cfg.args), drop="image_dropped" in self.faults)
            structured = structured_answer(body)
        except (ImageError, FormatError) as exc:
            raise ApiError(400, str(exc)) from None
        return seen, None if "schema_ignored" in self.faults else structured

    def chat(self, body: Any) -> Reply:
        """Answer one /v1/chat/completions request (raises ApiError like the engine would)."""
        self._check_alive()
        messages, tools, choice = self._validate(body)
        messages, structured = self._inputs(body, messages)
        prompt = render_prompt(messages, tools if choice != "none" else None)
        gen = self._generation(body, len(prompt.ids))
        asked = message_text(messages[-1].get("content")) if messages[-1].get("role") == "user" else ""
        facts, transferred = self._received(body, prompt.ids, prompt.text, asked)
        # A response_format grammar applies from the first token unless a reasoning parser marks where the
        # reasoning ends (vLLM's structured outputs and SGLang's grammar backend then start after it).
        thinks = structured is None or self.cfg.reasoning_parser is not None

        def decide(cached: int) -> Completion:
            """The completion as the KDA state after a hit of `cached` tokens lets the model read its context."""
            view = state_view(self.faults, len(prompt.ids), cached)
            answer = [structured] if structured is not None else recall_answer(prompt.text, asked, view, facts)
            return complete(messages, tools=tools, tool_choice=choice, answer=answer, state_tag=view.tag,
                            thinks=thinks, **gen)

        done = decide(0)
        # A required or named tool_choice runs guided decoding, which returns the call structured
        # whatever the tool parser; `auto` relies on the kimi_k3 parser.
        guided = choice == "required" or isinstance(choice, dict)
        parser = ChatParser(
            self.reasoning_key,
            self.cfg.reasoning_parser == "kimi_k3",
            self.cfg.tool_calls_structured or guided,
        )
        job = Job(prompt.ids, prompt.boundaries, done, rehit=decide if "wrong_cache_state" in self.faults else None,
                  **self._job_args(body), transferred=transferred)
        frame = Frame(self._head("chatcmpl", body), "chat.completion.chunk")
        if body.get("stream"):
            return Reply(chunks=self._chat_chunks(job, parser, frame, body))
        with closing(self._run(job)) as pieces:
            for piece in pieces:
                parser.delta(piece)
        choice_out = {
            "index": 0,
            "message": parser.message(self.cfg.mimic),
            "logprobs": None,
            "finish_reason": parser.finish_reason(job.done),
        }
        return Reply(
            body={
                **frame.head,
                "object": "chat.completion",
                "choices": [choice_out],
                "usage": self.usage(job),
            }, cached=job.cached
        )

    def _chat_chunks(
        self, job: Job, parser: ChatParser, frame: Frame, body: dict[str, Any]
    ) -> Generator[dict[str, Any], None, None]:
        include_usage, continuous = stream_flags(body, self.cfg.mimic)

        def out(chunk: dict[str, Any]) -> dict[str, Any]:
            return {**chunk, "usage": self.usage(job, brief=True)} if continuous else chunk

        finished = False
        with closing(self._run(job)) as pieces:
            for i, piece in enumerate(pieces):
                if i == 0:  # a prefix hit may have changed the completion (rehit): count it now
                    last = job.done.tokens - 1
                    yield out(frame.chat({"role": "assistant", "content": ""}))
                delta = parser.delta(piece)
                if delta is None:
                    continue
                # vLLM sends finish_reason with the last token; SGLang in a chunk of its own.
                finished = i == last and self.cfg.mimic == "vllm"
                yield out(frame.chat(delta, parser.finish_reason(job.done) if finished else None))
        if not finished:
            yield out(frame.chat({}, parser.finish_reason(job.done)))
        if include_usage:
            yield frame.usage(self.usage(job, stream=True))

    def completion(self, body: Any) -> Reply:
        """Answer one /v1/completions request: the raw text, no chat template and no parsers."""
        self._check_alive()
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "prompt: a non-empty string is required")
        self._check_model(body)
        ids = token_ids(prompt)
        args = self._generation(body, len(ids), COMPLETIONS_DEFAULT_MAX_TOKENS)
        _, transferred = self._received(body, ids, prompt, "")  # a PD decode generates from what it fetched
        job = Job(ids, [len(ids)], complete([{"role": "user", "content": prompt}], **args), **self._job_args(body),
                  transferred=transferred)
        frame = Frame(self._head("cmpl", body), "text_completion")
        if body.get("stream"):
            return Reply(chunks=self._text_chunks(job, frame, body))
        with closing(self._run(job)) as pieces:
            text = "".join(p.text for p in pieces)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": job.done.finish_reason}
        return Reply(
            body={**frame.head, "object": "text_completion", "choices": [choice], "usage": self.usage(job, chat=False)}
        )

    def _text_chunks(self, job: Job, frame: Frame, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        include_usage, continuous = stream_flags(body, self.cfg.mimic)
        last = job.done.tokens - 1
        with closing(self._run(job)) as pieces:
            for i, piece in enumerate(pieces):
                chunk = frame.text(piece.text, job.done.finish_reason if i == last else None)
                yield {**chunk, "usage": self.usage(job, brief=True)} if continuous else chunk
        if last < 0:
            yield frame.text("", job.done.finish_reason)
        if include_usage:
            yield frame.usage(self.usage(job, chat=False, stream=True))
