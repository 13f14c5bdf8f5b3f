"""The strict base of every topology section, and the limits the sections share."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
import os
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict

# Linux's PATH_MAX: a longer path can be opened on no node (and a log path repeated in the start script
# would pass the kernel's 128 KiB limit on one argument long before that).
PATH_MAX = 4096


class Strict(BaseModel):
    """Unknown keys are errors; values are immutable after load."""

    # Sections are built as part of Topology on its first validation, not each on its own at import.
    # No number is infinite or NaN: 1e999 reads as inf, and inf passes every `ge`/`gt` bound.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False)


@contextmanager
def no_pydantic_plugins() -> Iterator[None]:
    """Build our own validators without pydantic's plugin search, as typer builds its option adapters.

    A model's first validation (defer_build) asks pydantic for plugins, and pydantic then reads the entry
    points of every installed distribution (about 9 ms with 84 of them, on every `plan`). k3deploy registers
    no pydantic plugin and wants none observing its files. A plugin search done later in the process (by a
    model built outside this block) still finds every plugin, so nothing else changes.
    """
    previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous
