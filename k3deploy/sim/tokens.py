"""The stand-in's deterministic tokenizer and K3-style chat template (turn boundaries for the prefix cache).

A token is a K3 special token (`<|...|>`), a run of characters without whitespace or `<`, or a lone `<`.
Token ids are crc32 of the text (special tokens get ids above 2^32), so equal text always gives equal ids
across processes.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Python's \s, spelled out so that the Hugging Face tokenizer (Oniguruma regex) splits exactly the same way.
WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
TOKEN_PATTERN = f"<\\|[a-z_]+\\|>|[^{WHITESPACE}<]+|<"
TOKEN_RE = re.compile(TOKEN_PATTERN)
_SPECIAL_BASE = 1 << 32
# Ids are hashes, so detokenizing needs the text each id came from; a day of traffic stays well under this.
_SEEN_CAP = 1 << 20
_SEEN: dict[int, str] = {}

THINK_OPEN = "<|open|>think<|sep|>"
THINK_CLOSE = "<|close|>think<|sep|>"
TOOL_SECTION_BEGIN = "<|tool_calls_section_begin|>"
TOOL_SECTION_END = "<|tool_calls_section_end|>"
TOOL_CALL_BEGIN = "<|tool_call_begin|>"
TOOL_ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"


def tokenize(text: str) -> list[str]:
    """Split text into the stand-in's tokens."""
    return TOKEN_RE.findall(text)


def token_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each token."""
    return [m.span() for m in TOKEN_RE.finditer(text)]


def token_id(token: str) -> int:
    """A stable id for one token."""
    code = zlib.crc32(token.encode())
    return _SPECIAL_BASE + code if token.startswith("<|") else code


def token_ids(text: str) -> list[int]:
    """Ids of every token of text (remembered for detokenize)."""
    tokens = tokenize(text)
    ids = [token_id(t) for t in tokens]
    if len(_SEEN) < _SEEN_CAP:
        _SEEN.update(zip(ids, tokens))
    return ids


def detokenize(ids: Sequence[int]) -> str:
    """Text for ids this process has seen, one space between tokens (it tokenizes back to the same ids)."""
    missing = next((i for i in ids if i not in _SEEN), None)
    if missing is not None:
        raise KeyError(missing)
    return " ".join(_SEEN[i] for i in ids)


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


def prompt_text(content: Any) -> str:
    """A message's content as the chat template renders it: its text parts and its images' media text, in order."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content
                        if isinstance(p, dict) and p.get("type") in ("text", "media"))
    return message_text(content)


def render_tool_calls(calls: Sequence[dict[str, Any]]) -> str:
    """K3's raw tool-call section for calls in OpenAI form."""
    body = ""
    for i, call in enumerate(calls):
        fn = call.get("function", {})
        call_id = call.get("id") or f"functions.{fn.get('name', '')}:{i}"
        body += f"{TOOL_CALL_BEGIN}{call_id}{TOOL_ARGUMENT_BEGIN}{fn.get('arguments', '{}')}{TOOL_CALL_END}"
    return f"{TOOL_SECTION_BEGIN}{body}{TOOL_SECTION_END}"


def _message_block(message: dict[str, Any]) -> str:
    role = str(message.get("role", "user"))
    text = prompt_text(message.get("content"))
    if message.get("tool_calls"):
        text += render_tool_calls(message["tool_calls"])
    return f"<|im_{role}|>{role}<|im_middle|>{text}<|im_end|>"


@dataclass(frozen=True)
class Prompt:
    """Rendered prompt: token ids and the token offsets where each message (turn) ends."""

    text: str
    ids: list[int]
    boundaries: list[int]


def render_prompt(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
) -> Prompt:
    """Apply the chat template: tool declarations, one block per message, then the assistant's turn."""
    parts: list[str] = []
    if tools:
        parts.append(
            f"<|im_system|>tool_declare<|im_middle|>{json.dumps(list(tools), sort_keys=True)}<|im_end|>"
        )
    parts += [_message_block(m) for m in messages]
    ids: list[int] = []
    boundaries: list[int] = []
    for part in parts:
        ids += token_ids(part)
        boundaries.append(len(ids))
    generation = "<|im_assistant|>assistant<|im_middle|>"
    ids += token_ids(generation)
    return Prompt(text="".join(parts) + generation, ids=ids, boundaries=boundaries)
