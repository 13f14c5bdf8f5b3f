"""Shared CLI plumbing: the one place errors become messages and exit codes."""
from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from k3deploy.errors import K3Error

if TYPE_CHECKING:
    from k3deploy.diagnostics import Issue

CatalogOpt = Annotated[
    list[Path] | None,
    typer.Option("--catalog", help="folder of extra catalog YAML files (adds or overrides entries by id)"),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="show tracebacks")]


def print_warnings(issues: Iterable[Issue], file: str) -> None:
    """Each warning as one stderr line, `warning: file:line:col: path: message (hint) [CODE]`."""
    for issue in issues:
        if issue.severity == "warning":
            print(f"warning: {issue.render(file)} [{issue.code}]", file=sys.stderr)


def debug_enabled() -> bool:
    """--debug anywhere on the command line, or K3DEPLOY_DEBUG=1."""
    return "--debug" in sys.argv or os.environ.get("K3DEPLOY_DEBUG") == "1"


def run_app(app: Any) -> int:
    """Run typer; map K3Error to its exit code with a one-paragraph message, never a traceback."""
    argv = [a for a in sys.argv[1:] if a != "--debug"]
    try:
        # Without standalone mode click returns the code of a typer.Exit instead of raising it.
        rc = app(args=argv, prog_name="k3deploy", standalone_mode=False)
        if rc == 130:  # typer >= 0.29 turns Ctrl-C into a silent Exit(130), which click returns here
            print("interrupted", file=sys.stderr)
        return rc if isinstance(rc, int) else 0
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except K3Error as exc:
        return _report(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every other error becomes a message and exit code
        code = _parser_error(exc)
        if code is not None:
            return code
        missing = _missing_dependency(exc)
        if missing is not None:
            return _report(missing, exc)
        if debug_enabled():
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc}\n(rerun with --debug for a traceback and report it)",
              file=sys.stderr)
        return 70


def _report(exc: K3Error, cause: BaseException | None = None) -> int:
    """Print a user error (and with --debug the traceback of what raised it); its exit code."""
    if debug_enabled():
        traceback.print_exception(cause or exc)
    msg = f"error: {exc}"
    if exc.hint:
        msg += f"\nhint: {exc.hint}"
    print(msg, file=sys.stderr)
    return exc.exit_code


def _missing_dependency(exc: BaseException) -> K3Error | None:
    """An optional package that is not installed, as a user error naming its install: the ImportError
    itself, or the cause of an error a library raised from it."""
    from k3deploy.extras import missing_dependency

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ImportError):
            return missing_dependency(cur)
        cur = cur.__cause__
    return None


def _parser_error(exc: Exception) -> int | None:
    """The exit code of typer's own exceptions (its vendored click's in typer >= 0.29, click's before):
    usage errors print themselves and exit 2; None for anything else."""
    kind = type(exc)
    if not kind.__module__.startswith(("typer", "click")):
        return None
    names = {c.__name__ for c in kind.__mro__}
    if "Exit" in names:
        return int(getattr(exc, "exit_code", 0))
    if "Abort" in names:
        print("aborted", file=sys.stderr)
        return 130
    if "ClickException" in names:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 2))
    return None
