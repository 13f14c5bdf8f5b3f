"""Run one callable over many hosts at once with a bounded thread pool: N hosts cost ~one round trip."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 32


@dataclass(frozen=True)
class Outcome(Generic[T, R]):
    """One item's result or the exception it raised."""

    item: T
    value: R | None
    error: Exception | None

    @property
    def ok(self) -> bool:
        """No exception."""
        return self.error is None


class FanOut:
    """A reusable bounded pool; `map` returns outcomes in input order and never raises for an item."""

    def __init__(self, max_workers: int = MAX_WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix="k3fan")

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[Outcome[T, R]]:
        """Apply `fn` to every item concurrently and wait for all of them."""
        if len(items) == 1:  # no thread hop for the common single-host case
            return [_call(fn, items[0])]
        futures = [self._pool.submit(_call, fn, item) for item in items]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Wait for running calls and free the threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call(fn: Callable[[T], R], item: T) -> Outcome[T, R]:
    try:
        return Outcome(item, fn(item), None)
    except Exception as exc:  # noqa: BLE001 - handed back to the caller, who decides what a failure means
        return Outcome(item, None, exc)
