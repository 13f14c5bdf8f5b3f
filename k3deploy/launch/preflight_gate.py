"""The preflight that launch runs on the connected gang before anything starts, and its refusal."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from k3deploy.catalog.specs import Catalog
from k3deploy.launch.gang import Gang, GroupFailed
from k3deploy.launch.state import Failure, StateStore
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan

if TYPE_CHECKING:
    from k3deploy.preflight.report import Report


class PreflightFailed(GroupFailed):
    """Launch refused to start: a preflight check failed (exit 4, nothing was started)."""

    def __init__(self, report: Report) -> None:
        found = report.first_failure()
        assert found is not None
        check, v = found
        super().__init__(Failure(rank=v.rank, host=v.host, cause=f"{v.detail}; {v.fix} (preflight check {check.name})"))
        self.args = (f"preflight failed, nothing was started:\n{report.summary()}",)
        self.hint = "see every check: k3deploy preflight FILE; launch anyway: k3deploy launch --skip-preflight"


def preflight_gate(plan: Plan, catalog: Catalog, jobs: Sequence[NodeJob], store: StateStore) -> Callable[[Gang], None]:
    """The preflight launch runs on the connected gang's fleet before anything starts; records the verdict."""
    def gate(gang: Gang) -> None:
        from k3deploy.preflight.runner import run_preflight

        report = run_preflight(plan, catalog, jobs, gang.fleet)
        verdict: Literal["passed", "failed"] = "failed" if report.exit_code else "passed"
        store.update(gang.name, lambda d: d.model_copy(update={"preflight": verdict}))
        if report.exit_code:
            raise PreflightFailed(report)

    return gate
