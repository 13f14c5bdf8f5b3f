"""Bounded polling for tests of every tier."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.1) -> bool:
    """Poll until predicate() is true or the timeout passes; the last answer."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / step_s) + 2):
        if predicate():
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(step_s)
    return bool(predicate())
