"""The strict base of every topology section, and the limits the sections share."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
from pydantic import BaseModel, ConfigDict

# Linux's PATH_MAX: a longer path can be opened on no node (and a log path repeated in the start script
# would pass the kernel's 128 KiB limit on one argument long before that).
PATH_MAX = 4096


class Strict(BaseModel):
    """Unknown keys are errors; values are immutable after load."""

    # Sections are built as part of Topology on its first validation, not each on its own at import.
    # No number is infinite or NaN: 1e999 reads as inf, and inf passes every `ge`/`gt` bound.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False)
