"""`k3deploy launch` of replicas behind a router: the dry run, the launch and its summary (thin)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.cli.interrupts import sigterm_interrupts
from k3deploy.errors import InputError

if TYPE_CHECKING:
    from k3deploy.launch.service import ServicePlan


def launch_service(sp: ServicePlan, *, dry_run: bool, as_json: bool, attach: bool, skip_preflight: bool,
                   state_dir: Path | None) -> None:
    """Print what would run (dry run), or launch every replica and the router and print the service."""
    from rich.console import Console

    from k3deploy.launch import service_views
    from k3deploy.nodeplan.router_job import router_job

    if attach:
        raise InputError("--attach of replicas behind a router is not built yet",
                         hint=f"launch without --attach, then: k3deploy logs {sp.name} --follow")
    urls = sp.plan.router.settings.worker_urls if sp.plan.router is not None else ()
    router = router_job(sp.plan, urls, sp.overrides)
    if dry_run:
        if as_json:
            print(json.dumps({"replicas": [[j.model_dump(mode="json") for j in jobs] for _, jobs in sp.replicas],
                              "router": router.model_dump(mode="json")}, indent=2))
            return
        Console(highlight=False, soft_wrap=True).print(service_views.dry_run(sp, router))
        return
    from k3deploy.launch.service import launch_service as launch
    from k3deploy.launch.views import event_line
    from k3deploy.records.files import default_state_dir
    from k3deploy.records.store import StateStore

    store = StateStore(state_dir or sp.plan.topology.launch.state_dir or default_state_dir())
    err = Console(stderr=True, highlight=False)
    sigterm_interrupts()
    try:
        svc = launch(sp, store, on_event=None if as_json else lambda who, e: err.print(
            f"{who} {event_line(e)}", markup=False), skip_preflight=skip_preflight)
    except BaseException:
        if as_json:  # the record of the failed launch (its cause, the router's preflight), as for a deployment
            from k3deploy.records.service import ServiceStore

            rec = ServiceStore(store).load(sp.name)
            print(rec.model_dump_json(indent=2) if rec is not None else "{}")
        raise
    if as_json:
        print(svc.model_dump_json(indent=2))
    else:
        err.print(service_views.summary(svc), markup=False)
