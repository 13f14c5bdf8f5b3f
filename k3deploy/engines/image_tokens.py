"""What an image costs in context: K3's image processor arithmetic, as the engines run it.

The NaViT resize of vLLM's Kimi-K3 preprocessing (vllm-project/vllm vllm/models/kimi_k3/common/mm_preprocess.py
@25c255b9, `navit_resize_image`, the same in K2.5's media processor): scale = min(1, sqrt(in_patch_limit /
((w // p) x (h // p))), limit x p / w, limit x p / h); the scaled sides (int, at least 1, at most limit x p) are
padded up to a multiple of factor = merge x p; the pads (the tokens the projector's output fills) are
(h' / factor) x (w' / factor). The prompt gets them between K3's media markers (`wrapper_tokens_max`). Shared by
the planner, the stand-in engine and validate: one arithmetic, taken from the engine's source."""
from __future__ import annotations

import math
import re
from typing import NamedTuple

from k3deploy.catalog.specs import VisionSpec

IMAGE_PX_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class ImageTokens(NamedTuple):
    """One image through the processor: the size it is scaled to, its padding and the tokens it costs."""

    width: int
    height: int
    scaled_width: int
    scaled_height: int
    pad_width: int
    pad_height: int
    tokens: int  # <|media_pad|> tokens: the encoder's merged output, one embedding each

    @property
    def patches(self) -> int:
        """Patches the encoder runs over (before the merge)."""
        return self.tokens * 4


def image_tokens(vision: VisionSpec, width: int, height: int) -> ImageTokens:
    """The processor's resize and token count for a width x height image (ValueError for a side below 1)."""
    if width < 1 or height < 1:
        raise ValueError(f"an image of {width}x{height} px has no pixels")
    p, limit = vision.patch_size, vision.patch_limit_on_one_side
    s1 = math.sqrt(vision.in_patch_limit / (max(1.0, width // p) * max(1.0, height // p)))
    scale = min(1.0, s1, limit * p / width, limit * p / height)
    new_w = min(max(1, int(width * scale)), limit * p)
    new_h = min(max(1, int(height * scale)), limit * p)
    factor = vision.merge_kernel_size * p
    pad_w = (factor - new_w % factor) % factor
    pad_h = (factor - new_h % factor) % factor
    tokens = ((new_h + pad_h) // factor) * ((new_w + pad_w) // factor)
    return ImageTokens(width, height, new_w, new_h, pad_w, pad_h, tokens)


def parse_image_px(text: str) -> tuple[int, int]:
    """'WxH' -> (W, H); ValueError naming the expected form."""
    m = IMAGE_PX_RE.match(text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"{text!r} is not WIDTHxHEIGHT in pixels (e.g. 1024x768)")
    return int(m.group(1)), int(m.group(2))
