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
    """One file's outcome: the issues found while loading it, and a plan of what did load (None when
    nothing could stand in for a wrong value)."""

    file: str
    plan: Plan | None
    load_issues: tuple[Issue, ...] = ()

    @property
    def valid(self) -> bool:
        """Loaded without a schema error and no mistake in the file itself."""
        return not self.load_issues and self.plan is not None and self.plan.valid

    @property
    def exit_code(self) -> int:
        """0 feasible, 1 infeasible, 2 invalid input."""
        if not self.valid:
            return 2
        return 0 if self.plan is not None and self.plan.feasible else 1

    @property
    def issues(self) -> tuple[Issue, ...]:
        """Every issue, load-time then plan-time."""
        return self.load_issues + (self.plan.issues if self.plan is not None else ())


# Shown when a wrong value that nothing can stand in for stops every later check.
NOTHING_CHECKED = Issue(code="NOT_CHECKED", severity="info",
                        message="catalog ids, node list, parallel legality and memory: not checked until the "
                        "errors above are fixed (a required value is wrong)")


def plan_path(path: Path | str, catalog: Catalog) -> FileResult:
    """Load and plan one file without raising on bad input; with schema errors, plan what did load."""
    try:
        loaded = load_topology(path)
    except TopologyError as exc:
        if exc.partial is None:
            schema = any(i.code == "SCHEMA" for i in exc.issues)
            return FileResult(str(path), None, tuple(exc.issues) + ((NOTHING_CHECKED,) if schema else ()))
        return FileResult(str(path), make_plan(exc.partial, catalog, exc.unchecked), tuple(exc.issues))
    return FileResult(str(path), make_plan(loaded, catalog))


def catalog_for(dirs: list[Path] | None) -> Catalog:
    """The packaged catalog plus `--catalog` folders."""
    return load_catalog(tuple(Path(d).expanduser().resolve() for d in dirs or ()))


def require_feasible(path: Path | str, catalog: Catalog) -> Plan:
    """A feasible plan, or an error naming every problem (for render, launch, validate)."""
    result = plan_path(path, catalog)
    errors = [i for i in result.issues if i.severity == "error"]
    text = "\n".join(i.render(result.file) for i in errors)
    if not result.valid or result.plan is None:
        raise InputError(f"{result.file} is not a valid topology:\n{text}")
    if errors:
        raise InfeasibleError(f"{result.file} does not plan feasible:\n{text}",
                              hint=f"run `k3deploy plan {result.file}` for the full budget")
    return result.plan
