"""`k3deploy launch`: bring a topology up on its nodes, gang-supervised."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from k3deploy.cli.common import (
    CatalogOpt,
    ExecutorOpt,
    FileArg,
    exec_overrides,
    print_warnings,
    with_connection_options,
)
from k3deploy.cli.interrupts import sigterm_interrupts

if TYPE_CHECKING:
    from k3deploy.launch.events import NodeEvent

StateDirOpt = Annotated[Path | None, typer.Option(
    "--state-dir", help="deployment records (default: launch.state_dir, else $XDG_STATE_HOME/k3deploy)")]


@with_connection_options
def launch(
    file: FileArg,
    executor: ExecutorOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would run where; touch nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    attach: Annotated[bool, typer.Option("--attach", help="stay in the foreground streaming node logs; "
                                         "Ctrl-C stops the deployment")] = False,
    skip_preflight: Annotated[bool, typer.Option(
        "--skip-preflight", help="start without running `k3deploy preflight` first (recorded in the "
        "deployment record)")] = False,
    sync_weights: Annotated[str | None, typer.Option(
        "--sync-weights", metavar="DIR|HOST:DIR|hub", help="first run `k3deploy weights sync FILE --from "
        "DIR|HOST:DIR|hub` "
        "(validate.manifest); a sync that does not complete starts nothing")] = None,
    state_dir: StateDirOpt = None,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """Run preflight; start rank 0, then every worker; wait until rank 0 serves; leave a supervisor
    watching all nodes.

    A failed preflight check starts nothing (exit 4, naming the check, node and fix; --skip-preflight
    starts anyway and records it). Any node exiting, the readiness deadline or Ctrl-C stops every node and
    names the one that failed first (exit 4; 3 when a host cannot be reached; 5 when the deployment already
    runs).

    With `replicas` and a `router`: every replica is launched in parallel as its own deployment (NAME-r0, ...),
    then the router (NAME-router) with every ready replica registered; a replica that fails every try is named
    and left out (exit 0 while one serves; 4 when none does). Before any replica starts, the router's machine
    is checked (its port and metrics port free, router.python has the router): a failure starts nothing (exit 4)."""
    from k3deploy.launch.prepare import prepare

    unit = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    print_warnings(unit.warnings, unit.plan.file)
    from rich.console import Console
    from rich.live import Live

    from k3deploy.launch.unit import (
        dry_run_json,
        dry_run_view,
        launch_records,
        launch_summary,
        launch_unit,
        unit_record,
    )
    from k3deploy.launch.views import Progress, event_line

    store = launch_records(unit, state_dir, attach=attach)
    if dry_run:
        if as_json:
            print(dry_run_json(unit))
        else:
            Console(highlight=False, soft_wrap=True).print(dry_run_view(unit))
        return
    if sync_weights is not None:  # after the options are checked: a refusal costs no sync
        from k3deploy.launch.weights_unit import sync_unit

        synced, kept = sync_unit(unit, sync_weights, None, as_json)
        if synced.exit_code:
            lost = ", ".join(n.host for n in synced.nodes.values() if n.error)
            print(f"launch: the weights sync did not complete on {lost}; nothing was started (rerun to resume it)",
                  file=sys.stderr)
            raise typer.Exit(synced.exit_code)
        unit = kept  # the launch gets the nodes the sync filled
    err = Console(stderr=True, highlight=False)
    progress = Progress([(p.name, p.jobs) for p in unit.parts])
    live = Live(progress.table(), console=err, refresh_per_second=4, get_renderable=progress.table) \
        if err.is_terminal and not as_json else None

    def on_event(part: str, event: NodeEvent) -> None:
        progress.update(part, event)
        if live is None and not as_json:
            err.print(event_line(event, part), markup=False)

    sigterm_interrupts()
    try:
        if live is not None:
            live.start()
        launched = launch_unit(unit, store, on_event=on_event, attach=attach, skip_preflight=skip_preflight)
    except BaseException:
        if as_json:  # the record of the failed launch (its cause, its preflight)
            rec = unit_record(store, unit.name)
            print(rec.model_dump_json(indent=2) if rec is not None else "{}")
        raise
    finally:
        if live is not None:
            live.stop()
    if as_json and not attach:
        print(launched.model_dump_json(indent=2))
    else:
        err.print(launch_summary(launched), markup=False)
    if attach:
        from k3deploy.launch.follow import attach as supervise_here
        from k3deploy.launch.follow import prefixed

        supervise_here(store, unit.name, prefixed(sys.stdout),
                       on_event=lambda e: err.print(event_line(e), markup=False))
