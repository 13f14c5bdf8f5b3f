"""`k3deploy explain`: the known causes of a failed start in engine logs, with their fixes."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer


def explain(
    logs: Annotated[list[str], typer.Argument(help="log files (any engine's, ours or not); '-' reads stdin",
                                              show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="print the findings as JSON")] = False,
) -> None:
    """Name the known causes of a failure in engine logs: every matched signature of the failure catalog with its
    line numbers, cause, fix and source. Exit 1 when a cause is found, 0 when none is ("no known cause")."""
    from k3deploy.engines.failures import explain as explain_log

    found = {name: explain_log(_read(name)) for name in logs}
    if as_json:
        print(json.dumps({"logs": [{"log": name, "findings": [f.as_dict() for f in fs]} for name, fs in found.items()]},
                         indent=2))
    else:
        for name, fs in found.items():
            label = "stdin" if name == "-" else name
            if not fs:
                print(f"{label}: no known cause")
            for f in fs:
                s = f.signature
                print(f"{label}:{','.join(map(str, f.line_numbers))}: {s.id} ({s.category})\n"
                      f"  line:   {f.line}\n  cause:  {f.cause}\n  fix:    {f.fix}\n  source: {s.source}")
    raise typer.Exit(1 if any(found.values()) else 0)


def _read(name: str) -> str:
    from k3deploy.errors import InputError

    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}",
                         hint="give a log file, or '-' to read one from stdin") from None
