"""The check and stage runners' clock: a check or stage reports what it found, its runner how long it took."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def timed(run: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> tuple[T, float]:
    """run(*args, **kwargs)'s value and its wall time in seconds (rounded to the millisecond)."""
    start = time.monotonic()
    value = run(*args, **kwargs)
    return value, round(time.monotonic() - start, 3)
