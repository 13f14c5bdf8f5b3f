"""`k3deploy preflight`: every check on every node at once, before anything starts."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from k3deploy.cli.common import (
    CatalogOpt,
    ExecutorOpt,
    FileArg,
    exec_overrides,
    print_warnings,
    with_connection_options,
)


@with_connection_options
def preflight(
    file: FileArg,
    executor: ExecutorOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="also write a JUnit XML report here")] = None,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """Fingerprint every node and run a real rendezvous probe: reachability, hostname, interface, MTU,
    clock, checkpoint, /dev/shm, accelerators, driver, engine, Ray/Python, the rendezvous port, and a
    torch.distributed all_reduce with the engine's environment.

    With replicas or prefill/decode roles: every instance's preflight at once (each replica's, prefill's and
    decode's nodes, named in the table, the JSON and a JUnit suite each), and the router's machine: reachable,
    its port and metrics port free, its interpreter finding the router.

    Exit 0 when every check passes, 1 when one fails (each failure says how to fix it), 3 when a node
    cannot be reached (the worst over every instance)."""
    from rich.console import Console

    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.unit_preflight import preflight_unit
    from k3deploy.preflight.views import table, write_junit

    unit = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    print_warnings(unit.warnings, unit.plan.file)
    report = preflight_unit(unit)
    if junit is not None:
        write_junit(report, junit)
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        Console(highlight=False, soft_wrap=True).print(table(report))
    raise typer.Exit(report.exit_code)
