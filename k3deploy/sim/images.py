"""Image content parts as the engine takes them: a data URL or an http(s) URL, read to its pixel size and priced
by K3's image processor (the engines' arithmetic, k3deploy.engines.image_tokens), then put in the prompt between
K3's media markers the way vLLM's Kimi-K3 preprocessing expands its placeholder. PNG and JPEG sizes are read
from their headers (no image library). The `image_dropped` fault accepts the image and leaves it out."""
from __future__ import annotations

import base64
import binascii
import json
import struct
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from k3deploy.catalog.specs import VisionSpec
from k3deploy.engines.image_tokens import image_tokens

FETCH_TIMEOUT_S = 10.0
MAX_IMAGE_BYTES = 64 << 20  # SGLang's --media-url-max-file-size-mb default (64)
MEDIA_BEGIN, MEDIA_CONTENT, MEDIA_PAD, MEDIA_END = "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, extended, progressive, lossless...): they carry the size.
JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


class ImageError(ValueError):
    """An image part the engine refuses (400), with the reason."""


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG or JPEG from its header; ImageError for anything else."""
    if data.startswith(PNG_MAGIC) and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data.startswith(b"\xff\xd8"):
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker, length = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
            if marker in JPEG_SOF:
                height, width = struct.unpack(">HH", data[i + 5:i + 9])
                return int(width), int(height)
            i += 2 + length
    raise ImageError("cannot identify image file (the stand-in reads PNG and JPEG)")


def image_bytes(url: str) -> bytes:
    """The bytes a data URL holds or an http(s) URL serves; ImageError otherwise."""
    if url.startswith("data:"):
        head, sep, payload = url.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ImageError("a data URL must be data:<mime>;base64,<payload>")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageError(f"the data URL's base64 does not decode: {exc}") from None
    if url.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as reply:
                data = bytes(reply.read(MAX_IMAGE_BYTES + 1))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ImageError(f"cannot fetch the image at {url}: {exc}") from None
        if len(data) > MAX_IMAGE_BYTES:
            raise ImageError(f"the image at {url} is over {MAX_IMAGE_BYTES >> 20} MiB")
        return data
    raise ImageError(f"image_url must be a data URL or an http(s) URL, not {url[:40]!r}")


def media_text(vision: VisionSpec, width: int, height: int) -> str:
    """The prompt text one image becomes: its pads between K3's media markers."""
    pads = image_tokens(vision, width, height).tokens
    return f"{MEDIA_BEGIN}image {width}x{height}{MEDIA_CONTENT}{MEDIA_PAD * pads}{MEDIA_END}"


def resolve_images(messages: Sequence[dict[str, Any]], vision: VisionSpec | None, limit: int | None,
                   drop: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Messages with each image_url part replaced by the text its image becomes (none at all with `drop`), and
    the images seen; ImageError for an image the engine would refuse."""
    out: list[dict[str, Any]] = []
    seen = 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts: list[Any] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "image_url"):
                parts.append(part)
                continue
            seen += 1
            if vision is None:
                raise ImageError("this model does not take images")
            if limit is not None and seen > limit:
                raise ImageError(f"At most {limit} image(s) may be provided in one prompt.")
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            if not isinstance(url, str):
                raise ImageError("image_url.url: a string is required")
            width, height = image_size(image_bytes(url))
            if not drop:
                parts.append({"type": "media", "text": media_text(vision, width, height)})
        out.append({**message, "content": parts})
    return out, seen


def image_limit(args: dict[str, Any]) -> int | None:
    """Images a request may carry, from vLLM's --limit-mm-per-prompt or SGLang's --limit-mm-data-per-request
    (JSON, {"image": N}); None: no limit given."""
    for dest in ("limit_mm_per_prompt", "limit_mm_data_per_request"):
        raw = args.get(dest)
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                continue
        if isinstance(raw, dict) and isinstance(raw.get("image"), int):
            return int(raw["image"])
    return None
