"""Deterministic long prompts with facts at chosen depths, and the check of an answer that asks for them back.

The filler is a fixed rotation of plain sentences; each fact is `The access code of room-N is VALUE.` with a
value derived from the depth (the same deployment always gets the same prompt, so the same verdict). A nonce
opens every prompt so that one run never reads another run's prefix from the engine's cache.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SENTENCES = (
    "The committee reviewed the quarterly figures and agreed to meet again next week.",
    "Rain fell steadily over the harbour while the ferries kept to their timetable.",
    "A new bridge across the river shortened the morning commute for many families.",
    "The library extended its opening hours during the examination period this spring.",
    "Engineers replaced the old pumps at the water station without interrupting supply.",
    "The orchestra rehearsed the second movement twice before the evening concert.",
    "Farmers in the valley reported an early harvest after a warm and dry summer.",
    "The museum opened a small exhibition of maps drawn by travelling merchants.",
)
_CODE = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


@dataclass(frozen=True)
class Fact:
    """One fact planted at a depth (0..1 of the filler) and the question that asks for it."""

    depth: float
    key: str
    value: str

    @property
    def sentence(self) -> str:
        """The statement planted in the filler."""
        return f"The {self.key} is {self.value}."

    @property
    def question(self) -> str:
        """The question that asks for it."""
        return f"What is the {self.key}?"


def facts_at(depths: Sequence[float]) -> list[Fact]:
    """One fact per depth, values fixed by the depth alone."""
    out = []
    for i, depth in enumerate(depths):
        digest = hashlib.sha256(f"k3deploy-fact-{depth:.4f}".encode()).digest()
        code = "".join(_CODE[b % len(_CODE)] for b in digest[:6])
        out.append(Fact(depth, f"access code of room-{i + 1}", f"{code[:3]}-{code[3:]}"))
    return out


def haystack(sentences: int, facts: Sequence[Fact], nonce: str) -> str:
    """`sentences` filler sentences with each fact inserted at its depth, opened by the nonce."""
    body = [SENTENCES[i % len(SENTENCES)] for i in range(sentences)]
    for fact in sorted(facts, key=lambda f: f.depth, reverse=True):
        body.insert(round(fact.depth * sentences), fact.sentence)
    return f"Session {nonce}. Read the notes below; you will be asked about them.\n" + " ".join(body)


def questions(facts: Sequence[Fact]) -> str:
    """The closing request: every fact asked for, in depth order."""
    asked = " ".join(f.question for f in facts)
    return f"{asked} Answer each with the code exactly as written in the notes."


def retrieved(facts: Sequence[Fact], answer: str) -> dict[float, bool]:
    """Depth -> whether the answer contains that fact's value."""
    return {f.depth: f.value in answer for f in facts}


def depth_list(found: dict[float, bool], want: bool) -> str:
    """'10%, 90%' for the depths whose retrieval equals want."""
    return ", ".join(f"{d:.0%}" for d, ok in sorted(found.items()) if ok is want) or "none"


@dataclass(frozen=True)
class Sizing:
    """Prompt tokens as a line in filler sentences: tokens = overhead + per_sentence x sentences."""

    overhead: float
    per_sentence: float

    def sentences_for(self, tokens: int) -> int:
        """Filler sentences for a prompt of about `tokens` tokens."""
        return max(int((tokens - self.overhead) / self.per_sentence), 1)

    def tokens_for(self, sentences: int) -> int:
        """The prompt tokens expected for `sentences` filler sentences."""
        return round(self.overhead + self.per_sentence * sentences)


# Pairs of filler lengths (multiples of the sentence rotation) to fit the line from: the longer pair first,
# the shorter where the longer does not fit a small context.
CALIBRATION_SENTENCES = (48, 8)


def calibrate(count: Callable[[int], int | str]) -> Sizing | str:
    """Fit the line from two prompts counted by the engine's own tokenizer; else why not (the engine's error)."""
    why = ""
    for n in CALIBRATION_SENTENCES:
        small, large = count(n), count(2 * n)
        if isinstance(small, int) and isinstance(large, int) and large > small:
            per = (large - small) / n
            return Sizing(overhead=small - per * n, per_sentence=per)
        why = next((c for c in (small, large) if isinstance(c, str)), f"{n} and {2 * n} filler sentences "
                   f"counted {small} and {large} tokens (not growing)")
    return why
