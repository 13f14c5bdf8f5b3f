"""What preflight found: one check's rows over every node, the report, its exit code and the JSON form
(the rows, statuses and exit codes are k3deploy.verdicts', shared with validate). A service's report holds
each instance's report (replica 0, prefill 1, ...) beside its own checks (the router's node)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.verdicts.model import NodeRow, Status, exit_code, worst

# A check's verdict on one node is a NodeRow; the names stay for the checks that build them.
Verdict = NodeRow
__all__ = ["REFUSED_HINT", "CheckResult", "Report", "Status", "Verdict"]

# What launch tells a user whose preflight refused to start anything.
REFUSED_HINT = "see every check: k3deploy preflight FILE; launch anyway: k3deploy launch --skip-preflight"


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
    """Every check; the rendezvous probe's per-node measurements; a service's instances' own reports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="the deployment's name (a service's instance: its own, NAME-r0, NAME-prefill0)")
    instance: str = Field("", description="which instance of the service this is (replica 0, prefill 0, decode 1); "
                          "empty for a deployment of its own or the service itself")
    checks: tuple[CheckResult, ...]
    elapsed_s: float
    measurements: dict[int, dict[str, Any]] = Field(default_factory=dict,
                                                     description="rank -> rendezvous probe timings and bandwidth")
    instances: tuple[Report, ...] = Field((), description="a service's: every instance's report, in launch order "
                                          "(the service's own checks, the router's, are `checks`)")

    def parts(self) -> Iterator[Report]:
        """This report and every instance's, the instances first (the order of the table and the summary)."""
        yield from self.instances
        yield self

    @property
    def exit_code(self) -> int:
        """3 when a host could not be asked, 1 when a check failed, else 0 (over every instance)."""
        return exit_code((c.status for p in self.parts() for c in p.checks), unreachable_first=True)

    def first_failure(self) -> tuple[CheckResult, NodeRow] | None:
        """The first failed check (in check order, instances first) and its first failed node."""
        for p in self.parts():
            for c in p.checks:
                bad = c.failures()
                if bad:
                    return c, bad[0]
        return None

    def summary(self) -> str:
        """One line per failed check and node: `[instance: ]check: rank R (host): detail; fix` (fixes are
        imperatives)."""
        lines = []
        for p in self.parts():
            for c in p.checks:
                lines += [f"{failure_line(p, c.name, v)}{f'; {v.fix}' if v.fix else ''}" for v in c.failures()]
        return "\n".join(lines)

    def refusal(self) -> str:
        """What launch says when this report refuses the start."""
        return f"preflight failed, nothing was started:\n{self.summary()}"

    def as_json(self) -> dict[str, Any]:
        """The JSON form (`preflight --json`): each check's status, the exit code, each instance's the same."""
        data = self.model_dump(mode="json", exclude={"instances"})
        data["exit_code"] = self.exit_code
        for c, raw in zip(self.checks, data["checks"]):
            raw["status"] = c.status
        data["instances"] = [i.as_json() for i in self.instances]
        return data


def failure_line(part: Report, check: str, v: NodeRow) -> str:
    """`[instance: ]check: rank R (host): detail`, the words naming a failed node wherever it is shown."""
    where = f"{part.instance}: " if part.instance else ""
    return f"{where}{check}: rank {v.rank} ({v.host}): {v.detail}"
