"""Plan topology files: the library call behind `k3deploy plan` (and every later command)."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import Catalog
from k3deploy.diagnostics import Issue
from k3deploy.errors import InfeasibleError, InputError
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import TopologyError, load_topology


class FileResult(NamedTuple):
    """One file's outcome: a plan, or the issues that kept it from loading."""

    file: str
    plan: Plan | None
    load_issues: tuple[Issue, ...] = ()

    @property
    def exit_code(self) -> int:
        """0 feasible, 1 infeasible, 2 invalid input."""
        if self.plan is None or not self.plan.valid:
            return 2
        return 0 if self.plan.feasible else 1

    @property
    def issues(self) -> tuple[Issue, ...]:
        """Every issue, load-time or plan-time."""
        return self.plan.issues if self.plan is not None else self.load_issues


def plan_path(path: Path | str, catalog: Catalog) -> FileResult:
    """Load and plan one file without raising on bad input."""
    try:
        loaded = load_topology(path)
    except TopologyError as exc:
        return FileResult(str(path), None, tuple(exc.issues))
    return FileResult(str(path), make_plan(loaded, catalog))


def catalog_for(dirs: list[Path] | None) -> Catalog:
    """The packaged catalog plus `--catalog` folders."""
    return load_catalog(tuple(Path(d).expanduser().resolve() for d in dirs or ()))


def require_feasible(path: Path | str, catalog: Catalog) -> Plan:
    """A feasible plan, or an error naming every problem (for render, launch, validate)."""
    result = plan_path(path, catalog)
    errors = [i for i in result.issues if i.severity == "error"]
    text = "\n".join(i.render(result.file) for i in errors)
    if result.plan is None or not result.plan.valid:
        raise InputError(f"{result.file} is not a valid topology:\n{text}")
    if errors:
        raise InfeasibleError(f"{result.file} does not plan feasible:\n{text}",
                              hint=f"run `k3deploy plan {result.file}` for the full budget")
    return result.plan
