"""Stage `vision`: an image reaches the model. The same question is asked through rank 0's API with and without a
generated PNG (a data URL); the request with the image must be accepted and its `usage.prompt_tokens` must grow
by the image's pads as K3's processor counts them (k3deploy.engines.image_tokens, the engines' arithmetic) plus
at most the media markers around them (the catalog's `wrapper_tokens_max`).

Both engines report the prompt as the model saw it: vLLM's usage.prompt_tokens is len(final_res.prompt_token_ids),
the ids after the multimodal processor replaced each placeholder with `<|media_begin|>image WxH<|media_content|>`
+ the pads + `<|media_end|>` (entrypoints/openai serving_chat's UsageInfo; vllm/models/kimi_k3/common/
mm_preprocess.py _get_prompt_updates). An image left out of the prompt, or priced by another processor's
rules, shows as a growth outside that band."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from k3deploy.engines.image_tokens import image_tokens
from k3deploy.executors.http import NodeHttp
from k3deploy.validate import reach
from k3deploy.validate.image import png_data_url, served_png
from k3deploy.validate.stage import StageResult, ValidateContext
from k3deploy.validate.stages.short import CHAT_PATH, served_model

IMAGE_PX = (448, 336)  # 16 x 12 merged tokens: no resize, no padding
QUESTION = "What pattern does this picture show?"
# Enough to be answered; the stage reads only usage.prompt_tokens.
MAX_TOKENS = 16


def _prompt_tokens(http: NodeHttp, body: dict[str, Any], timeout_s: float) -> int:
    reply = http.post(CHAT_PATH, body, timeout_s)
    if not reply.ok:
        raise ValueError(f"HTTP {reply.status}: {reply.text[:300]}")
    usage = reply.json().get("usage") or {}
    count = usage.get("prompt_tokens")
    if isinstance(count, int):
        return count
    raise ValueError(f"no usage.prompt_tokens in the answer: {json.dumps(usage)[:200]}")


REFUSED = "refused by http URL"


class VisionStage:
    """A question with and without an image; the image's tokens counted as K3's processor counts them."""

    name = "vision"
    needs_deployment = True

    def run(self, ctx: ValidateContext) -> StageResult:
        """Two requests through rank 0's API."""
        vision = ctx.model.vision
        if vision is None:
            return StageResult(name=self.name, status="skip", detail=f"{ctx.model.id} has no vision encoder in the "
                               "catalog: nothing to send an image to")
        if ctx.topology.serving.images_per_request == 0:
            return StageResult(name=self.name, status="skip", detail="serving.images_per_request is 0: the "
                               "deployment serves text only")
        width, height = IMAGE_PX
        pads = image_tokens(vision, width, height).tokens
        band = (pads, pads + vision.wrapper_tokens_max)
        timeout_s = ctx.topology.validate_.request_timeout_s
        with reach.rank0_http(ctx, timeout_s) as http:
            base = {"model": served_model(http, ctx.topology.model.id), "max_tokens": MAX_TOKENS, "temperature": 0,
                    "reasoning_effort": "low"}

            def ask(url: str | None) -> int:
                parts = [{"type": "image_url", "image_url": {"url": url}}] if url else []
                content: Any = [*parts, {"type": "text", "text": QUESTION}] if parts else QUESTION
                return _prompt_tokens(http, {**base, "messages": [{"role": "user", "content": content}]}, timeout_s)

            try:
                without = ask(None)
            except (ValueError, KeyError) as exc:
                return StageResult(name=self.name, status="fail", detail=f"the text-only request: {exc}")
            try:
                with_image = ask(png_data_url(width, height))
            except (ValueError, KeyError) as exc:
                return StageResult(name=self.name, status="fail", detail=f"a {width}x{height} PNG as a data URL was "
                                   f"refused: {exc}", evidence=f"prompt_tokens without the image: {without}")
            by_url, url_note = self._by_url(ctx, ask, width, height)
        grew = with_image - without
        results = {"image_px": [width, height], "predicted_image_tokens": pads, "prompt_tokens_text": without,
                   "prompt_tokens_with_image": with_image, "grew_by": grew,
                   "prompt_tokens_with_image_url": by_url}
        evidence = (f"prompt_tokens {without:,} without, {with_image:,} with a {width}x{height} PNG (data URL): "
                    f"+{grew:,}; K3's processor: {pads:,} pads, + at most {vision.wrapper_tokens_max} marker tokens; "
                    + (f"by http URL: {by_url:,}" if by_url is not None else url_note))
        url_ok = by_url == with_image or (by_url is None and not url_note.startswith(REFUSED))
        if band[0] <= grew <= band[1] and url_ok:
            url = " and by an http URL" if by_url is not None else f" ({url_note})"
            return StageResult(name=self.name, status="pass", results=results, evidence=evidence,
                               detail=f"a {width}x{height} PNG accepted as a data URL{url}: prompt_tokens +{grew:,} "
                               f"({pads:,} image tokens predicted, {grew - pads} for the media markers)")
        if band[0] <= grew <= band[1]:
            said = f"prompt_tokens {by_url:,}, against {with_image:,} as a data URL" if by_url is not None else url_note
            return StageResult(name=self.name, status="fail", results=results, evidence=evidence,
                               detail=f"the same PNG by an http URL on this machine: {said}")
        if grew < pads:
            why = ("the image was accepted but is not in the prompt (dropped before the model)" if grew <= 0 else
                   "fewer than K3's processor gives: the engine prices images by other rules")
        else:
            why = "more than K3's processor gives: the engine prices images by other rules"
        return StageResult(name=self.name, status="fail", results=results, evidence=evidence,
                           detail=f"prompt_tokens grew by {grew:,} with a {width}x{height} image, {pads:,} predicted "
                           f"(+ up to {vision.wrapper_tokens_max} for the markers): {why}")

    @staticmethod
    def _by_url(ctx: ValidateContext, ask: Callable[[str | None], int], width: int, height: int
                ) -> tuple[int | None, str]:
        """(prompt_tokens, "") of the image sent by an http URL served on this machine, or (None, why not: rank 0
        elsewhere could not reach a server here; or the engine refused it)."""
        if not ctx.topology.launch.nodes_are_here:
            return None, "not sent by URL: rank 0 is not this machine, it could not reach a server here"
        with served_png(width, height) as url:
            try:
                return ask(url), ""
            except (ValueError, KeyError) as exc:
                return None, f"{REFUSED} {url}: {exc}"
