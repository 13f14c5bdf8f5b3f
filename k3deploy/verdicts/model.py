"""The one report model of preflight and validate: a status, a row per node, and the 0/1/3 exit code."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pass", "fail", "skip", "error"]
EXIT_OK, EXIT_FAILED, EXIT_HOST = 0, 1, 3


class NodeRow(BaseModel):
    """One node's outcome within a check or stage: pass, fail (with the fix), skip (with the reason), error
    (the node could not be asked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(description="node rank")
    host: str = Field(description="host as the topology names it")
    status: Status = Field(description="pass | fail | skip | error")
    detail: str = Field("", description="one line: what was found on this node (for fail: what is wrong)")
    fix: str = Field("", description="how to fix a failure (an imperative)")
    problems: list[str] = Field(default_factory=list, description="every problem found on this node, one per line")


def worst(statuses: Iterable[Status]) -> Status:
    """The status of several rows: error beats fail beats pass beats skip (all skipped is skip)."""
    found = set(statuses)
    order: tuple[Status, ...] = ("error", "fail", "pass")
    return next((s for s in order if s in found), "skip")


def exit_code(statuses: Iterable[Status], *, unreachable_first: bool) -> int:
    """0 nothing failed, 1 something failed, 3 a node could not be asked. Preflight puts 3 first (a node it
    could not ask may hide any failure: reach it, then check again); validate puts 1 first (a stage's
    failure is a finding about the deployment whatever other stages could not reach)."""
    found = set(statuses)
    failed, unreached = "fail" in found, "error" in found
    if unreached and (unreachable_first or not failed):
        return EXIT_HOST
    return EXIT_FAILED if failed else EXIT_OK
