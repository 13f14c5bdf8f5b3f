"""What preflight found: one verdict per check and node, the exit code, and the JSON form."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pass", "fail", "skip", "error"]
EXIT_OK, EXIT_FAILED, EXIT_HOST = 0, 1, 3


class Verdict(BaseModel):
    """One check on one node: pass, fail (with the fix), skip (with the reason), error (host unreachable)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    host: str
    status: Status
    detail: str = Field("", description="what was found (for fail: what is wrong)")
    fix: str = Field("", description="how to fix a failure")


class CheckResult(BaseModel):
    """One named check over every node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    title: str
    asks: str = Field(description="what the check asks each node")
    verdicts: tuple[Verdict, ...]
    elapsed_s: float = 0.0

    @property
    def status(self) -> Status:
        """error beats fail beats pass beats skip."""
        found = {v.status for v in self.verdicts}
        order: tuple[Status, ...] = ("error", "fail", "pass")
        for s in order:
            if s in found:
                return s
        return "skip"

    def failures(self) -> list[Verdict]:
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
        statuses = {c.status for c in self.checks}
        return EXIT_HOST if "error" in statuses else EXIT_FAILED if "fail" in statuses else EXIT_OK

    def first_failure(self) -> tuple[CheckResult, Verdict] | None:
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
