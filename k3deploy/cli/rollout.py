"""`k3deploy rollout`: restart replicas (or prefill/decode instances) behind their router one at a time, never
fewer than N-1 replicas (or one instance of each role) serving."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from k3deploy.cli.common import (
    CatalogOpt,
    ExecutorOpt,
    exec_overrides,
    with_connection_options,
)
from k3deploy.cli.status import StateDirOpt


@with_connection_options
def rollout(
    target: Annotated[str, typer.Argument(help="the service's topology file (its current content is applied), "
                                          "or its name (the file it was launched from)", show_default=False)],
    drain_s: Annotated[float, typer.Option("--drain-s", min=1, help="longest wait for a replica's or instance's "
                                           "in-flight requests")] = 120.0,
    skip_short: Annotated[bool, typer.Option("--skip-short", help="leave out the `short` validate stage of each "
                                             "new replica or instance (a model that cannot pass it, e.g. random "
                                             "weights that never stop)")] = False,
    executor: ExecutorOpt = None,
    state_dir: StateDirOpt = None,
    catalog: CatalogOpt = None,
    **connection: Any,
) -> None:
    """One replica at a time: out of the router (drained), stopped, started, a real completion and the `short`
    validate stage straight to it, back in and healthy. Prefill/decode roles: one instance at a time, prefills
    first: out of the router (drained) while a completion through the router shows the rest serve, stopped,
    started, back in with its role (a prefill with its bootstrap port), healthy, seen serving, `short` through
    the router. Exit 2 before anything when a role has a single instance or the router cannot take PD workers
    back (vllm-router). Exit 4 at the first failure, naming the replica or instance (and role) and the stage;
    the others keep serving."""
    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.unit import launch_summary, launched_from, rollout_unit
    from k3deploy.records.locate import locate
    from k3deploy.validate.replica_check import replica_stage

    found = locate(target, str(state_dir) if state_dir else None)
    store, name = found.store, found.name
    file = found.file or launched_from(store, name) or Path(target)
    unit = prepare(file, catalog, exec_overrides({"executor": executor, **connection}))

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    print(launch_summary(rollout_unit(unit, store, say=say, drain_s=drain_s, checks_for=lambda plans, reach: [] if
                                      skip_short else [("short", replica_stage(plans, unit.catalog, store, "short",
                                                                               reach))])))
