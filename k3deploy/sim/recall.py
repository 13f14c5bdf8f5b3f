"""What the stand-in "reads" from its context: facts stated in the prompt, recalled through the simulated KDA
(linear-attention) state, so that a lost or wrongly restored state shows as lost facts, not as broken text.

A fact is a sentence `The KEY is VALUE.` whose KEY ends in `of NAME` ("The access code of room-3 is
Q7X-41."); a question is `What is the KEY?` in the last user message. The greedy answer states every asked
fact, in the order asked: its VALUE when the state still holds the token where the fact was stated, else a
fluent, deterministic wrong value. The state holds every prompt token, except under these faults:
`kda_state_zeroed` (none), `kda_state_lost_beyond:N` (only the last N tokens of the prompt), and
`wrong_cache_state` on a prefix hit (nothing before the hit: the restored state belongs to another prefix,
and every token generated after it differs from the cold answer).
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass

from k3deploy.sim.faults import Faults
from k3deploy.sim.tokens import token_spans

FACT_RE = re.compile(r"\b[Tt]he ((?:[a-z]+ ){1,4}of [A-Za-z0-9-]+) is ([A-Za-z0-9-]+)\.")
QUESTION_RE = re.compile(r"\b[Ww]hat is the ((?:[a-z]+ ){1,4}of [A-Za-z0-9-]+)\?")
_VALUE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


@dataclass(frozen=True)
class StateView:
    """The prompt tokens the state holds (positions >= first_held; None: none) and a tag naming a wrong state."""

    first_held: int | None
    tag: bytes = b""


def state_view(faults: Faults, prompt_tokens: int, cached_tokens: int) -> StateView:
    """What the KDA state holds for a prompt of which cached_tokens came from the prefix cache."""
    if "kda_state_zeroed" in faults:
        return StateView(None)
    first = 0
    if "kda_state_lost_beyond" in faults:
        first = max(prompt_tokens - int(faults.value("kda_state_lost_beyond", prompt_tokens // 2)), 0)
    if "wrong_cache_state" in faults and cached_tokens > 0:
        return StateView(max(first, cached_tokens), tag=f"wrong-state:{cached_tokens}".encode())
    return StateView(first)


def _fake_value(key: str, seed: bytes) -> str:
    digest = hashlib.sha256(seed + key.encode()).digest()
    code = "".join(_VALUE_CHARS[b % len(_VALUE_CHARS)] for b in digest[:5])
    return f"{code[:3]}-{code[3:]}"


Facts = dict[str, tuple[str, int]]


def read_facts(prompt_text: str, asked: str) -> Facts:
    """Every fact stated before the first question of `asked`: KEY -> (VALUE, token position); a later
    statement of a key wins."""
    asks = QUESTION_RE.search(asked)
    starts = [s for s, _ in token_spans(prompt_text)]
    base = prompt_text.rfind(asked)
    end = base + asks.start() if base >= 0 and asks else len(prompt_text)
    facts: Facts = {}
    for match in FACT_RE.finditer(prompt_text, 0, end):
        facts[match.group(1)] = (match.group(2), bisect.bisect_left(starts, match.start()))
    return facts


def recall_answer(prompt_text: str, asked: str, view: StateView, facts: Facts | None = None) -> list[str] | None:
    """The answer's words when the last user message asks for facts, else None (the ordinary answer).
    `facts` is what the state carries when it was not computed here (a decode's transferred state)."""
    keys = [m.group(1) for m in QUESTION_RE.finditer(asked)]
    if not keys:
        return None
    held_facts = read_facts(prompt_text, asked) if facts is None else facts
    words: list[str] = []
    for key in keys:
        value, position = held_facts.get(key, ("", -1))
        held = view.first_held is not None and position >= view.first_held
        if not value or not held:
            value = _fake_value(key, view.tag + prompt_text[:64].encode())
        words += ["The", *key.split(), "is", f"{value}."]
    return words
