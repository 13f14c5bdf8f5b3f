"""The preflight that launch runs on the connected gang before anything starts, and its refusal; a service's
router checks (its machine, before any instance starts)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from k3deploy.catalog.specs import Catalog
from k3deploy.errors import ExecError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.launch.gang import Gang, GroupFailed
from k3deploy.launch.prepare import Unit
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Failure
from k3deploy.records.recorder import Recorder, Verdict

if TYPE_CHECKING:
    from k3deploy.preflight.report import Report

HINT = "see every check: k3deploy preflight FILE; launch anyway: k3deploy launch --skip-preflight"


class PreflightFailed(GroupFailed):
    """Launch refused to start: a preflight check failed (exit 4, nothing was started)."""

    def __init__(self, report: Report) -> None:
        found = report.first_failure()
        assert found is not None
        check, v = found
        super().__init__(Failure(rank=v.rank, host=v.host, cause=f"{v.detail}; {v.fix} (preflight check {check.name})"))
        self.args = (f"preflight failed, nothing was started:\n{report.summary()}",)
        self.hint = HINT


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


def router_gate(unit: Unit, record: Callable[[Verdict], object], factory: ExecutorFactory = open_executor) -> None:
    """The router checks launch of a service runs before starting any instance, on the unit's router; `record`
    gets the verdict.
    A check failed: PreflightFailed (exit 4); its machine could not be asked: ExecError (exit 3, as for any
    node launch cannot reach)."""
    from k3deploy.preflight.report import Report
    from k3deploy.preflight.router_check import router_checks  # loaded only when a service is launched
    from k3deploy.verdicts.model import EXIT_HOST

    assert unit.router is not None and unit.plan.router is not None
    t0 = time.monotonic()
    report = Report(name=unit.name, checks=router_checks(unit.plan.router.settings, unit.router.jobs[0], factory),
                    elapsed_s=round(time.monotonic() - t0, 3))
    record("failed" if report.exit_code else "passed")
    if report.exit_code == EXIT_HOST:
        raise ExecError(f"preflight could not ask the router's machine, nothing was started:\n{report.summary()}",
                        hint=f"reach it (router.runs_on), then: {HINT}")
    if report.exit_code:
        raise PreflightFailed(report)
