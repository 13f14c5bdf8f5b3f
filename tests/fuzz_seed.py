"""The fuzzers' seed and budget for one run: a new seed each run (so runs add up to new inputs), shown in the
header and the summary so a failure can be replayed with K3_FUZZ_SEED; K3_FUZZ_SCALE scales every test's
example count (default 0.2 of the counts the tests name: about 850 inputs a run instead of 4,250)."""
from __future__ import annotations

import os
import random

# tests/conftest.py sets K3_FUZZ_SEED before collection when it is unset, so every process of a run (xdist
# workers inherit the environment) draws from the same seed.
SEED = int(os.environ.get("K3_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
SCALE = float(os.environ.get("K3_FUZZ_SCALE", "0.2"))


def examples(named: int) -> int:
    """A test's example budget for this run: its named count scaled, at least 10."""
    return max(10, round(named * SCALE))


def replay_line() -> str:
    return f"fuzz seed {SEED} (replay a failure with K3_FUZZ_SEED={SEED}; K3_FUZZ_SCALE={SCALE:g})"
