"""The preflight that launch runs on the connected gang before anything starts, and its refusal (a service's
router is checked before any instance starts: preflight/router_check.py `router_gate`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from k3deploy.catalog.specs import Catalog
from k3deploy.launch.gang import Gang, GroupFailed
from k3deploy.planning.plan import Plan
from k3deploy.preflight.report import REFUSED_HINT
from k3deploy.records.deployment import Failure
from k3deploy.records.recorder import Recorder

if TYPE_CHECKING:
    from k3deploy.preflight.report import Report


class PreflightFailed(GroupFailed):
    """Launch refused to start: a preflight check failed (exit 4, nothing was started)."""

    def __init__(self, report: Report) -> None:
        found = report.first_failure()
        assert found is not None
        check, v = found
        super().__init__(Failure(rank=v.rank, host=v.host, cause=f"{v.detail}; {v.fix} (preflight check {check.name})"))
        self.args = (report.refusal(),)
        self.hint = REFUSED_HINT


def preflight_gate(plan: Plan, catalog: Catalog, recorder: Recorder) -> Callable[[Gang], None]:
    """The preflight launch runs on the connected gang's nodes before anything starts; the verdict is recorded."""
    def gate(gang: Gang) -> None:
        from k3deploy.preflight.runner import run_preflight

        report = run_preflight(plan, catalog, gang.jobs, gang.fleet)
        refusal = PreflightFailed(report) if report.exit_code else None
        recorder.checked("passed" if refusal is None else "failed")
        if refusal is not None:
            raise refusal

    return gate
