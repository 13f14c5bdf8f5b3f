"""The stand-in's images and structured output without processes: image_url parts (data URL, a loopback http URL)
priced by K3's processor arithmetic in usage.prompt_tokens, the per-request image limit, response_format JSON
schemas answered validly, and the faults that break each (image_dropped, schema_ignored)."""
from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.image_tokens import image_tokens
from k3deploy.sim.admission import admit
from k3deploy.sim.chat_service import ApiError, ChatService
from k3deploy.sim.engine_args import parse_engine_args
from k3deploy.sim.faults import Faults
from k3deploy.sim.images import image_size
from k3deploy.sim.log_format import EngineLog, first_gpu_ranks
from k3deploy.sim.serve_config import resolve_config
from k3deploy.validate.image import png_bytes, png_data_url, served_png

pytestmark = pytest.mark.timeout(30)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "minLength": 12},
                                           "days": {"type": "integer", "minimum": 3, "maximum": 7},
                                           "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "days", "tags", "unit"], "additionalProperties": False}


def engine(mimic: str, *flags: str, fault: str | None = None) -> ChatService:
    """A ready stand-in head serving kimi-k3-tiny (its vision entry: K3's processor) with `flags`."""
    cat = load_catalog()
    ns = parse_engine_args(mimic, ["--mimic", mimic, "/m", *flags])  # type: ignore[arg-type]
    cfg = resolve_config(mimic, ns, {})  # type: ignore[arg-type]
    one_gpu = first_gpu_ranks(0, 1, tp=1, pp=1, ep=1, dp=1, attention_dp=False, nnodes=1)
    svc = ChatService(cfg, admit(cfg, cat.models["kimi-k3-tiny"], cat.hardware["sim"]),
                      EngineLog(cfg.mimic, one_gpu, io.StringIO()), faults=Faults({fault: None} if fault else {}),
                      vision=cat.models["kimi-k3-tiny"].vision)
    svc.state = "ready"
    return svc


def prompt_tokens(svc: ChatService, content: Any, **body: Any) -> int:
    reply = svc.chat({"messages": [{"role": "user", "content": content}], "max_tokens": 64, **body}).body
    assert reply is not None
    return int(reply["usage"]["prompt_tokens"])


def with_image(url: str, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


@pytest.fixture
def loopback_png() -> Iterator[str]:
    """An http URL on 127.0.0.1 serving a 1000 x 700 PNG."""
    with served_png(1000, 700) as url:
        yield url


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_an_image_costs_its_processor_tokens_plus_the_media_markers(mimic: str, loopback_png: str) -> None:
    svc = engine(mimic)
    vision = load_catalog().model("kimi-k3-tiny").vision
    assert vision is not None
    text_only = prompt_tokens(svc, "What is in the picture?")
    # <|media_begin|> image 448x448 <|media_content|> 256 x <|media_pad|> <|media_end|>
    assert prompt_tokens(svc, with_image(png_data_url(448, 448))) - text_only == 256 + 5
    pads = image_tokens(vision, 1000, 700).tokens
    assert pads == 900 and prompt_tokens(svc, with_image(loopback_png)) - text_only == pads + 5
    assert prompt_tokens(svc, [*with_image(png_data_url(448, 448)), *with_image(loopback_png, "and?")]) \
        - prompt_tokens(svc, "What is in the picture? and?") == 256 + 900 + 10


def test_image_dropped_accepts_the_image_and_leaves_it_out() -> None:
    svc = engine("vllm", fault="image_dropped")
    assert prompt_tokens(svc, with_image(png_data_url(448, 448))) == prompt_tokens(svc, "What is in the picture?")


@pytest.mark.parametrize("content, said", [
    (with_image("data:image/png;base64,???"), "the data URL's base64 does not decode"),
    (with_image("data:image/png;base64,aGVsbG8="), "cannot identify image file"),
    (with_image("ftp://example.invalid/x.png"), "image_url must be a data URL or an http\\(s\\) URL"),
    (with_image("http://127.0.0.1:9/nothing.png"), "cannot fetch the image at http://127.0.0.1:9/nothing.png"),
    ([*with_image(png_data_url(28, 28)), *with_image(png_data_url(28, 28))], "At most 1 image\\(s\\) may be provided"),
])
def test_an_image_the_engine_cannot_take_is_a_400(content: Any, said: str) -> None:
    svc = engine("vllm", "--limit-mm-per-prompt", '{"image": 1}')
    with pytest.raises(ApiError, match=said) as caught:
        prompt_tokens(svc, content)
    assert caught.value.status == 400


def test_image_size_reads_png_and_jpeg_headers() -> None:
    assert image_size(png_bytes(3, 2)) == (3, 2)
    jpeg = b"\xff\xd8" + b"\xff\xe0\x00\x04ab" + b"\xff\xc0\x00\x11\x08\x02\xbc\x03\xe8" + bytes(12)
    assert image_size(jpeg) == (1000, 700)


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_a_json_schema_response_format_is_answered_valid_against_it(mimic: str) -> None:
    svc = engine(mimic, "--reasoning-parser", "kimi_k3")
    body = {"messages": [{"role": "user", "content": "Plan a trip"}], "max_tokens": 256,
            "response_format": {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}}
    reply = svc.chat(body).body
    assert reply is not None
    answer = json.loads(reply["choices"][0]["message"]["content"])
    assert not list(Draft202012Validator(SCHEMA).iter_errors(answer)), answer
    ignored = engine(mimic, "--reasoning-parser", "kimi_k3", fault="schema_ignored").chat(body).body
    assert ignored is not None
    with pytest.raises(ValueError):
        json.loads(ignored["choices"][0]["message"]["content"])
    with pytest.raises(ApiError, match="json_schema.schema: a JSON Schema object is required"):
        svc.chat({**body, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})


def test_without_a_reasoning_parser_the_grammar_holds_from_the_first_token() -> None:
    """vLLM applies a response_format grammar after the reasoning only when a reasoning parser says where it ends;
    without one the whole output is the JSON, no think block before it."""
    body = {"messages": [{"role": "user", "content": "Plan a trip"}], "max_tokens": 12,
            "response_format": {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}}
    reply = engine("vllm").chat(body).body
    assert reply is not None
    content = reply["choices"][0]["message"]["content"]
    assert "<|" not in content and not list(Draft202012Validator(SCHEMA).iter_errors(json.loads(content))), content
    assert reply["choices"][0]["finish_reason"] == "stop"
