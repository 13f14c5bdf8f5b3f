"""The catalog specs' base: strict, frozen, built on first use; a Sourced spec names a source for every number."""
# No `from __future__ import annotations` here (as in topology/): pydantic would compile every annotation
# string when the classes are created, on the start-up path of every command (half this module's import).
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 1 << 30

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class Spec(BaseModel):
    """Strict, immutable base for catalog entries."""

    # Built on first validation: a run that takes the validated catalog from the cache never validates.
    # No number is infinite or NaN: 1e999 reads as inf, and inf passes every `ge`/`gt` bound.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, allow_inf_nan=False)


class Sourced(Spec):
    """A spec whose numeric fields must each name a source."""

    sources: dict[str, str] = Field(description="field name -> where the number comes from")

    @model_validator(mode="after")
    def _every_number_sourced(self) -> "Sourced":
        missing = [
            name
            for name, value in self
            if name != "sources" and _is_number(value) and name not in self.sources
        ]
        if missing:
            raise ValueError(f"no source for: {', '.join(missing)}")
        return self


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_number(v) for v in value)
