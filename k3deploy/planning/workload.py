"""A serving workload as `--workload in=8192,out=1024,concurrency=16[,effort=high][,prompts=80]
[,images=N,image_px=WxH]` gives it."""
from __future__ import annotations

from typing import Any, NamedTuple

from k3deploy.catalog.specs import ModelSpec
from k3deploy.engines.image_tokens import image_tokens, parse_image_px
from k3deploy.errors import InputError

EFFORTS = ("low", "high", "max")
# Far past any served context: a bigger number is a typo, and would only make the arithmetic meaningless.
MAX_TOKENS = 1 << 24
MAX_CONCURRENCY = 1 << 20
EXAMPLE = "in=8192,out=1024,concurrency=16,effort=high"


class Workload(NamedTuple):
    """Fixed prompt and answer lengths at a fixed concurrency, as `vllm bench serve --dataset-name random
    --random-range-ratio 1 --max-concurrency C` runs it. `output_tokens` counts every completion token,
    reasoning included, so the effort changes how long answers are, not what a token costs."""

    input_tokens: int
    output_tokens: int
    concurrency: int
    effort: str = "max"
    num_prompts: int | None = None
    images: int = 0  # images per request, each image_px in size
    image_px: tuple[int, int] | None = None
    text_tokens: int | None = None  # with images, once resolved for a model: the text part of input_tokens
    image_tokens: int = 0  # once resolved: prompt tokens one image adds (its pads and K3's markers around them)

    @property
    def prompts(self) -> int:
        """Requests in the run (default 5 x concurrency, the cookbooks' convention)."""
        return self.num_prompts or 5 * self.concurrency

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value."""
        return self._asdict()


_KEYS = {"in": "input_tokens", "out": "output_tokens", "concurrency": "concurrency", "effort": "effort",
         "prompts": "num_prompts", "images": "images", "image_px": "image_px"}
MAX_IMAGES = 1024


def parse_workload(text: str) -> Workload:
    """`in=8192,out=1024,concurrency=16[,effort=high][,prompts=N]` -> Workload; InputError names the part."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise InputError(f"--workload {text!r}: '{part}' is not one of {', '.join(k + '=' for k in _KEYS)}",
                             hint=f"e.g. --workload {EXAMPLE}")
        if _KEYS[key] in values:
            raise InputError(f"--workload {text!r}: '{key}' given twice", hint=f"e.g. --workload {EXAMPLE}")
        values[_KEYS[key]] = _value(text, key, raw.strip())
    missing = [k for k in ("in", "out", "concurrency") if _KEYS[k] not in values]
    if missing:
        raise InputError(f"--workload {text!r}: missing {', '.join(k + '=' for k in missing)}",
                         hint=f"e.g. --workload {EXAMPLE}")
    if bool(values.get("images")) != ("image_px" in values):
        raise InputError(f"--workload {text!r}: images=N and image_px=WxH go together (N images of W x H pixels "
                         "per request)", hint="e.g. --workload in=2048,out=512,concurrency=8,images=2,image_px=1024x768")
    return Workload(**values)


def with_images(w: Workload, model: ModelSpec) -> Workload:
    """The workload as `model` sees it: each image's tokens (K3's processor arithmetic, plus the markers around
    them) added to input_tokens; InputError for images sent to a model without a vision encoder."""
    if not w.images or w.text_tokens is not None:
        return w
    if model.vision is None or w.image_px is None:
        raise InputError(f"--workload images={w.images}: {model.id} has no vision encoder in the catalog",
                         hint="drop images= and image_px=, or plan a multimodal model")
    each = image_tokens(model.vision, *w.image_px).tokens + model.vision.wrapper_tokens_max
    return w._replace(input_tokens=w.input_tokens + w.images * each, text_tokens=w.input_tokens, image_tokens=each)


def _value(text: str, key: str, raw: str) -> Any:
    if key == "image_px":
        try:
            return parse_image_px(raw)
        except ValueError as exc:
            raise InputError(f"--workload {text!r}: image_px={exc}") from None
    if key == "effort":
        if raw not in EFFORTS:
            raise InputError(f"--workload {text!r}: effort={raw!r}: expected one of {', '.join(EFFORTS)}")
        return raw
    limit = {"concurrency": MAX_CONCURRENCY, "prompts": MAX_CONCURRENCY, "images": MAX_IMAGES}.get(key, MAX_TOKENS)
    low = {"out": 2, "images": 0}.get(key, 1)  # TPOT needs a second token
    try:
        n = int(raw.replace("_", ""))
    except ValueError:
        n = -1
    if not low <= n <= limit:
        raise InputError(f"--workload {text!r}: {key}={raw!r}: expected a whole number from {low} to {limit:,}")
    return n
