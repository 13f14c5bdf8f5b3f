"""The `k3deploy` command line: thin typer commands over library calls."""
from __future__ import annotations

import importlib
import sys

import typer

from k3deploy.cli.common import run_app

HELP = ("Plan, render, launch and validate multi-node Kimi K3 deployments.\n\n"
        "Exit codes: 0 ok; 1 infeasible plan or failed validation; 2 invalid input; 3 host error; "
        "4 launch failed; 5 state error; 130 interrupted.")

# Command name -> module under k3deploy.cli holding a function of the same name; listed in help order.
COMMANDS = ("plan", "schema", "launch", "status", "logs", "stop", "render", "validate", "manifest")


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or (for a run of one command) just that one: typer builds each
    registered command's options on every run, so one command skips the others' imports and option work."""
    app = typer.Typer(name="k3deploy", help=HELP, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, rich_markup_mode=None)
    if only is not None:
        app.callback()(_group)  # keeps `k3deploy NAME ...` a group even with a single command
    for name in (only,) if only is not None else COMMANDS:
        target = getattr(importlib.import_module(f"k3deploy.cli.{name}"), name)
        if isinstance(target, typer.Typer):  # a command group (manifest create / from-hub)
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def _group() -> None:
    """Plan, render, launch and validate multi-node Kimi K3 deployments."""


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # the full app, for tests and embedding
        return build_app()
    raise AttributeError(name)


def main() -> None:
    """Console-script entry point."""
    args = [a for a in sys.argv[1:] if a != "--debug"]
    only = args[0] if args and args[0] in COMMANDS else None
    sys.exit(run_app(build_app(only)))
