"""`k3deploy launch`: bring a topology up on its nodes, gang-supervised."""
from __future__ import annotations

import json
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
    from k3deploy.catalog.specs import Catalog
    from k3deploy.launch.events import NodeEvent
    from k3deploy.nodeplan.jobs import NodeJob
    from k3deploy.planning.plan import Plan

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

    prep = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))
    print_warnings(prep.warnings, prep.plan.file)
    if sync_weights is not None and not dry_run:
        from k3deploy.launch.weights_unit import sync_unit

        synced, kept = sync_unit(prep, sync_weights, None, as_json)
        if synced.exit_code:
            lost = ", ".join(n.host for n in synced.nodes.values() if n.error)
            print(f"launch: the weights sync did not complete on {lost}; nothing was started (rerun to resume it)",
                  file=sys.stderr)
            raise typer.Exit(synced.exit_code)
        prep = kept  # the launch gets the nodes the sync filled
    if prep.service is not None:
        from k3deploy.cli.launch_service import launch_service

        launch_service(prep.service, dry_run=dry_run, as_json=as_json, attach=attach, skip_preflight=skip_preflight,
                       state_dir=state_dir)
        return
    if dry_run:
        _print_dry_run(prep.jobs, as_json)
        return
    _launch(prep.plan, prep.jobs, state_dir, as_json, attach, None if skip_preflight else prep.catalog)


def _print_dry_run(jobs: tuple[NodeJob, ...], as_json: bool) -> None:
    if as_json:
        print(json.dumps([j.model_dump(mode="json") for j in jobs], indent=2))
        return
    from rich.console import Console

    from k3deploy.launch.views import dry_run

    Console(highlight=False, soft_wrap=True).print(dry_run(jobs))


def _launch(plan: Plan, jobs: tuple[NodeJob, ...], state_dir: Path | None, as_json: bool, attach: bool,
            catalog: Catalog | None) -> None:
    """Launch; `catalog` None means --skip-preflight."""
    from rich.console import Console
    from rich.live import Live

    from k3deploy.launch import deploy
    from k3deploy.launch.views import Progress, deployment_summary, event_line
    from k3deploy.records.files import default_state_dir
    from k3deploy.records.store import StateStore

    store = StateStore(state_dir or plan.topology.launch.state_dir or default_state_dir())
    err = Console(stderr=True, highlight=False)
    progress = Progress(jobs)
    live = Live(progress.table(), console=err, refresh_per_second=4, get_renderable=progress.table) \
        if err.is_terminal and not as_json else None

    def on_event(event: NodeEvent) -> None:
        progress.update(event)
        if live is None and not as_json:
            err.print(event_line(event), markup=False)

    sigterm_interrupts()
    try:
        if live is not None:
            live.start()
        dep = deploy.launch(plan, jobs, store, on_event=on_event, background=not attach,
                            preflight_catalog=catalog, skip_preflight=catalog is None)
    except BaseException:
        if as_json:
            rec = store.load(plan.topology.name)
            print(rec.model_dump_json(indent=2) if rec is not None else "{}")
        raise
    finally:
        if live is not None:
            live.stop()
    if as_json and not attach:
        print(dep.model_dump_json(indent=2))
    else:
        err.print(deployment_summary(dep), markup=False)
    if attach:
        from k3deploy.launch.follow import attach as supervise_here
        from k3deploy.launch.follow import prefixed

        supervise_here(store, plan.topology.name, prefixed(sys.stdout),
                       on_event=lambda e: err.print(event_line(e), markup=False))
