"""The base of every record: strict and frozen, so a record changes only through model_copy."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """Base of the state models: tolerant of nothing, mutable through model_copy only."""

    model_config = ConfigDict(extra="forbid", frozen=True)
