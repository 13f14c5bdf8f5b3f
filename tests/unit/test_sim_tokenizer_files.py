"""The tiny checkpoint's tokenizer files: loaded offline by HF tokenizers, counting as the stand-in does."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from k3deploy.sim.generation import complete
from k3deploy.sim.tokenizer_files import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, write_tokenizer_files
from k3deploy.sim.tokens import render_prompt, tokenize
from tests.sim_requests import LONG_QUESTION, TOOLS

pytestmark = pytest.mark.timeout(60)


@functools.cache
def shared_files() -> Path:
    """One directory of tokenizer files for the whole module (hypothesis examples cannot take fixtures)."""
    out = Path(tempfile.mkdtemp(prefix="k3sim-tok-"))
    assert write_tokenizer_files(out) == [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]
    return out


@functools.cache
def hf_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(shared_files() / TOKENIZER_FILE))  # a local file: no network involved


@pytest.fixture(scope="module")
def files() -> Iterator[Path]:
    yield shared_files()
    shutil.rmtree(shared_files(), ignore_errors=True)


@pytest.fixture(scope="module")
def hf(files: Path) -> Tokenizer:
    return hf_tokenizer()


def hf_count(tok: Tokenizer, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=True).ids)


def test_counts_agree_on_what_the_stand_in_generates(hf: Tokenizer) -> None:
    for effort in ("low", "max"):
        done = complete(
            [{"role": "user", "content": "Call get_weather for Paris"}], tools=TOOLS, effort=effort
        )
        assert hf_count(hf, done.raw) == done.tokens
    prompt = render_prompt([{"role": "user", "content": LONG_QUESTION}], TOOLS)
    assert hf_count(hf, prompt.text) == len(prompt.ids)
    known = hf.encode("<|open|>think<|sep|> consider the request")
    assert hf.token_to_id("[UNK]") not in known.ids


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.from_regex(r"[a <|_>\s]{0,40}"))
def test_counts_agree_on_any_text(files: Path, text: str) -> None:
    assert hf_count(hf_tokenizer(), text) == len(tokenize(text))


def apply_chat_template(files: Path, messages: list[dict[str, Any]], tools: Any = None) -> str:
    """What transformers' apply_chat_template renders (a sandboxed Jinja env with a JSON tojson)."""
    config = json.loads((files / TOKENIZER_CONFIG_FILE).read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(config["chat_template"]).render(
        messages=messages, tools=tools, add_generation_prompt=True
    )


@pytest.mark.parametrize(
    ("messages", "tools"),
    [
        ([{"role": "user", "content": "What is the weather in Paris?"}], None),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
                }
            ],
            None,
        ),
        (
            [
                {"role": "user", "content": "Call get_weather for Paris"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "functions.get_weather:0",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "functions.get_weather:0"},
            ],
            TOOLS,
        ),
    ],
)
def test_chat_template_counts_as_the_stand_in_prompt(
    files: Path, hf: Tokenizer, messages: list[dict[str, Any]], tools: Any
) -> None:
    text = apply_chat_template(files, messages, tools)
    assert hf_count(hf, text) == len(render_prompt(messages, tools).ids)


def test_make_checkpoint_ships_the_tokenizer_in_its_manifest(tmp_path: Path) -> None:
    from k3deploy.checkpoint.manifest import verify_directory
    from k3deploy.sim.checkpoint import write_checkpoint

    manifest = write_checkpoint(tmp_path)
    assert {TOKENIZER_FILE, TOKENIZER_CONFIG_FILE} <= set(manifest.files)
    assert verify_directory(tmp_path, manifest) == []
    tok = Tokenizer.from_file(str(tmp_path / TOKENIZER_FILE))
    config = json.loads((tmp_path / TOKENIZER_CONFIG_FILE).read_text())
    assert config["model_max_length"] == 65536 and tok.get_vocab_size() > 40
