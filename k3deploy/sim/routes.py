"""The head's POST routes per mimicked engine: completions, vLLM's tokenizer endpoints, the cache flushes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from k3deploy.sim.chat_service import ApiError, ChatService, Reply
from k3deploy.sim.tokens import detokenize, render_prompt, token_ids, tokenize

Answer = Reply | tuple[int, Any, str]
Route = Callable[[Any], Answer]
JSON = "application/json"
SGLANG_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
    "the operation will not be performed.)\n"
)


# vLLM 0.32's scale-out routes (entrypoints/scale_out/factories.py): `vllm serve` without --enable-scale-out
# registers each and answers 403; vllm-router 0.1.17 asks /v1/chat/completions/render first for every chat
# request and falls back to /tokenize.
VLLM_SCALE_OUT_ROUTES = (
    "/v1/chat/completions/render", "/v1/messages/render", "/v1/completions/render", "/v1/responses/render",
    "/v1/chat/completions/derender", "/v1/completions/derender", "/inference/v1/generate",
)
VLLM_SCALE_OUT_OFF = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."


def _body(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise ApiError(400, "Expected a JSON object")
    return request


def _tokenize(svc: ChatService, request: Any) -> Answer:
    body = _body(request)
    if isinstance(body.get("messages"), list):
        prompt = render_prompt(body["messages"], body.get("tools"))
        # render_prompt always appends the assistant turn's opening; add_generation_prompt=false drops it.
        ids = prompt.ids if body.get("add_generation_prompt", True) else prompt.ids[: prompt.boundaries[-1]]
        text = prompt.text
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
        ids = token_ids(text)
    else:
        raise ApiError(400, "Either `prompt` (a string) or `messages` is required")
    strs = tokenize(text)[: len(ids)] if body.get("return_token_strs") else None
    return (
        200,
        {"count": len(ids), "max_model_len": svc.admission.context_length, "tokens": ids, "token_strs": strs},
        JSON,
    )


def _detokenize(svc: ChatService, request: Any) -> Answer:
    ids = _body(request).get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ApiError(400, "tokens: a list of token ids is required")
    try:
        return 200, {"prompt": detokenize(ids)}, JSON
    except KeyError as exc:
        raise ApiError(400, f"Token id {exc.args[0]} is out of vocabulary") from exc


def _flush_sglang(svc: ChatService, request: Any) -> Answer:
    return (200 if svc.flush_cache() else 400), SGLANG_FLUSHED, "text/plain; charset=utf-8"


def _reset_vllm(svc: ChatService, request: Any) -> Answer:
    # vLLM answers 200 even when running requests keep it from resetting (it only logs a warning).
    if not svc.flush_cache():
        svc.log.warning("Failed to reset prefix cache because some blocks are not freed yet.")
    return 200, b"", "text/plain"


def _scale_out_off(svc: ChatService, request: Any) -> Answer:
    raise ApiError(403, VLLM_SCALE_OUT_OFF, "PermissionDeniedError")


def post_route(svc: ChatService, path: str) -> Route | None:
    """The handler for a POST path on this engine, or None (404)."""
    routes: dict[str, Callable[[ChatService, Any], Answer]] = {
        # Through the instance, so a role's service (a PD prefill or decode) answers with its own chat.
        "/v1/chat/completions": lambda s, request: s.chat(request),
        "/v1/completions": lambda s, request: s.completion(request),
    }
    if svc.cfg.mimic == "sglang":
        routes["/flush_cache"] = _flush_sglang
    else:
        routes |= {"/tokenize": _tokenize, "/detokenize": _detokenize}
        routes |= {path: _scale_out_off for path in VLLM_SCALE_OUT_ROUTES}
        if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":  # vLLM's development endpoints
            routes["/reset_prefix_cache"] = _reset_vllm
    handler = routes.get(path)
    return None if handler is None else (lambda request: handler(svc, request))
