"""What preflight found: one check's rows over every node, the report, its exit code and the JSON form
(the rows, statuses and exit codes are k3deploy.verdicts', shared with validate)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.verdicts.model import NodeRow, Status, exit_code, worst

# A check's verdict on one node is a NodeRow; the names stay for the checks that build them.
Verdict = NodeRow
__all__ = ["CheckResult", "Report", "Status", "Verdict"]


class CheckResult(BaseModel):
    """One named check over every node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    title: str
    asks: str = Field(description="what the check asks each node")
    verdicts: tuple[NodeRow, ...]
    elapsed_s: float = Field(0.0, description="wall time of the check (the runner measures it)")

    @property
    def status(self) -> Status:
        """error beats fail beats pass beats skip."""
        return worst(v.status for v in self.verdicts)

    def failures(self) -> list[NodeRow]:
        """The failed and errored verdicts, rank order."""
        return [v for v in self.verdicts if v.status in ("fail", "error")]


class Report(BaseModel):
    """Every check; the rendezvous probe's per-node measurements."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    checks: tuple[CheckResult, ...]
    elapsed_s: float
    measurements: dict[int, dict[str, Any]] = Field(default_factory=dict,
                                                     description="rank -> rendezvous probe timings and bandwidth")

    @property
    def exit_code(self) -> int:
        """3 when a host could not be asked, 1 when a check failed, else 0."""
        return exit_code((c.status for c in self.checks), unreachable_first=True)

    def first_failure(self) -> tuple[CheckResult, NodeRow] | None:
        """The first failed check (in check order) and its first failed node."""
        for c in self.checks:
            bad = c.failures()
            if bad:
                return c, bad[0]
        return None

    def summary(self) -> str:
        """One line per failed check and node: `check: rank R (host): detail; fix` (fixes are imperatives)."""
        lines = []
        for c in self.checks:
            for v in c.failures():
                fix = f"; {v.fix}" if v.fix else ""
                lines.append(f"{c.name}: rank {v.rank} ({v.host}): {v.detail}{fix}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The JSON form (`preflight --json`)."""
        data = self.model_dump(mode="json")
        data["exit_code"] = self.exit_code
        for c, raw in zip(self.checks, data["checks"]):
            raw["status"] = c.status
        return data
