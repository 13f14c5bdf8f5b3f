"""A real byte-level BPE tokenizer for the tiny real-engine checkpoints, trained here on a fixed local text
(no download): any text encodes (no unknown token) and decodes back, as a hub tokenizer does."""
from __future__ import annotations

import json
from pathlib import Path

from k3deploy.sim.generation import FILLER_WORDS

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, PAD, "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# A plain role template: vLLM's /v1/chat/completions renders it with transformers' apply_chat_template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for m in messages %}<|{{ m.role }}|>\n"
    "{%- if m.content is string %}{{ m.content }}"
    "{%- else %}{%- for p in m.content if p.type == 'text' %}{{ p.text }}{%- endfor %}{%- endif %}"
    "<|end|>\n{%- endfor %}{%- if add_generation_prompt %}<|assistant|>\n{%- endif %}"
)
_CORPUS_WORDS = (*FILLER_WORDS, "system", "user", "assistant", "answer", "question", "number", "secret",
                 "the", "and", "of", "to", "in", "is", "what", "which", "key", "value", "remember")


def _corpus() -> list[str]:
    # Deterministic text: the words in many orders, digits and punctuation, so merges are stable per run.
    words = list(dict.fromkeys(_CORPUS_WORDS))
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += [" ".join(str(n) for n in range(k, k + 50)) + " , . : ; ? ! ( ) \" '" for k in range(0, 1000, 50)]
    return lines


def write_tokenizer(directory: Path, vocab_size: int, max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json (vocab exactly `vocab_size`, specials first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:  # the corpus ran out of merges: the config would lie
        raise ValueError(f"trained {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "add_bos_token": False,
              "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def special_ids(directory: Path) -> dict[str, int]:
    """The ids of BOS, EOS and PAD in a written tokenizer.json."""
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    return {"bos": vocab[BOS], "eos": vocab[EOS], "pad": vocab[PAD]}
