"""The tiny checkpoint's tokenizer files: Hugging Face `tokenizers` loads them offline and counts tokens
exactly as the stand-in does, and the chat template renders prompts as the stand-in's does.

The split is the stand-in's own pattern (k3deploy.sim.tokens.TOKEN_PATTERN) as a Split pre-tokenizer that
keeps the matches and drops the whitespace between them. The vocabulary is small (K3's special tokens and
the words the stand-in generates); any other word becomes [UNK], so counts always agree while ids agree
only inside the vocabulary (the stand-in's own ids are hashes of the text).
"""

from __future__ import annotations

import json
from pathlib import Path

from k3deploy.sim.generation import FILLER_WORDS
from k3deploy.sim.tokens import TOKEN_PATTERN

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
UNK = "[UNK]"
SPECIAL_TOKENS = (
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_tool|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_WORDS = ("think", "system", "user", "assistant", "tool", "tool_declare", "The", "asks:", "returned:",
          "Stand-in", "answer:")  # fmt: skip
# render_prompt's template in Jinja, as transformers' apply_chat_template runs it.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif %}"
    "{%- for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
    "{%- if m.content is string %}{{ m.content }}"
    "{%- elif m.content %}{%- for p in m.content if p.type == 'text' %}{{ ' ' if not loop.first }}{{ p.text }}"
    "{%- endfor %}{%- endif %}"
    "{%- if m.tool_calls %}<|tool_calls_section_begin|>{%- for c in m.tool_calls %}<|tool_call_begin|>"
    "{{ c.id or 'functions.' ~ c.function.name ~ ':' ~ loop.index0 }}<|tool_call_argument_begin|>"
    "{{ c.function.arguments }}<|tool_call_end|>{%- endfor %}<|tool_calls_section_end|>{%- endif %}"
    "<|im_end|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{%- endif %}"
)


def vocabulary() -> dict[str, int]:
    """Token -> id: [UNK] first, then K3's special tokens, then the words the stand-in generates."""
    words = [UNK, *SPECIAL_TOKENS, *_WORDS, *FILLER_WORDS]
    return {w: i for i, w in enumerate(dict.fromkeys(words))}


def write_tokenizer_files(directory: Path | str, max_length: int = 65536) -> list[str]:
    """Write tokenizer.json and tokenizer_config.json into directory; return their names."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

    out = Path(directory)
    tok = Tokenizer(models.WordLevel(vocabulary(), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(TOKEN_PATTERN), behavior="removed", invert=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(out / TOKENIZER_FILE))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "unk_token": UNK,
        "eos_token": "<|im_end|>",
        "pad_token": UNK,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]
