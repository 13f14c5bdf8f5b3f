"""The `k3deploy` command line: thin typer commands over library calls."""
from __future__ import annotations

import gc
import importlib
import sys
from typing import Annotated

import typer

from k3deploy.cli.common import run_app

HELP = ("Plan, render, launch and validate multi-node Kimi K3 deployments.\n\n"
        "Exit codes: 0 ok; 1 infeasible plan, failed preflight check or failed validation; 2 invalid input; 3 host error; "
        "4 launch failed, or `status` of a failed deployment; 5 state error; 6 a package the command needs is not "
        "installed (the message names the install); 70 a bug in k3deploy ("
        "rerun with --debug and report it); 130 interrupted. `explain` exits 1 when it finds a known cause, 0 when "
        "it finds none.")

# Command name -> module under k3deploy.cli holding a function of the same name; listed in help order.
COMMANDS = ("demo", "plan", "schema", "preflight", "launch", "status", "top", "logs", "stop", "rollout", "render",
            "validate", "calibrate", "explain", "manifest", "weights")
# Commands that run to their end in about a second, run without the cycle collector: their start-up (imports,
# pydantic building schemas, typer's option adapters) allocates enough for about 90 collections, 5-6% of
# a `plan`'s wall time, and frees nearly everything by reference count (peak RSS of a 13-file plan or a
# --search --speculation ranking is the same with the collector off). Long-running commands keep it.
BATCH_COMMANDS = ("plan", "render", "schema")


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or (for a run of one command) just that one: typer builds each
    registered command's options on every run, so one command skips the others' imports and option work."""
    app = typer.Typer(name="k3deploy", help=HELP, no_args_is_help=True, add_completion=True,
                      pretty_exceptions_enable=False, rich_markup_mode=None)
    app.callback()(_group)  # global options; keeps `k3deploy NAME ...` a group even with a single command
    for name in (only,) if only is not None else COMMANDS:
        target = getattr(importlib.import_module(f"k3deploy.cli.{name}"), name)
        if isinstance(target, typer.Typer):  # a command group (manifest create / from-hub)
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def _version(value: bool) -> None:
    if value:
        from k3deploy import __version__

        print(f"k3deploy {__version__}")
        raise typer.Exit()


def _group(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="show a traceback with an error (accepted anywhere on "
                                        "the command line; or set K3DEPLOY_DEBUG=1)")] = False,
) -> None:
    """Plan, render, launch and validate multi-node Kimi K3 deployments."""
    # --debug is taken off the command line before typer parses it (see main): it is listed here for help.


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # the full app, for tests and embedding
        return build_app()
    raise AttributeError(name)


def main() -> None:
    """Console-script entry point."""
    args = [a for a in sys.argv[1:] if a != "--debug"]
    only = args[0] if args and args[0] in COMMANDS else None
    if only in BATCH_COMMANDS:
        gc.disable()
    sys.exit(run_app(build_app(only)))
