"""The `k3deploy` command line: thin typer commands over library calls."""
from __future__ import annotations

import sys

import typer

from k3deploy.cli import launch as _launch
from k3deploy.cli import logs as _logs
from k3deploy.cli import plan as _plan
from k3deploy.cli import render as _render
from k3deploy.cli import schema as _schema
from k3deploy.cli import status as _status
from k3deploy.cli import stop as _stop
from k3deploy.cli.common import run_app

app = typer.Typer(
    name="k3deploy",
    help="Plan, render, launch and validate multi-node Kimi K3 deployments.\n\n"
    "Exit codes: 0 ok; 1 infeasible plan or failed validation; 2 invalid input; 3 host error; "
    "4 launch failed; 5 state error; 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("plan")(_plan.plan)
app.command("schema")(_schema.schema)
app.command("launch")(_launch.launch)
app.command("status")(_status.status)
app.command("logs")(_logs.logs)
app.command("stop")(_stop.stop)
app.command("render")(_render.render)


def main() -> None:
    """Console-script entry point."""
    sys.exit(run_app(app))
