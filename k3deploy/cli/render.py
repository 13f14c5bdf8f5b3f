"""`k3deploy render`: the exact per-node engine commands, as text, JSON, scripts, sbatch or LWS."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from k3deploy.cli.common import CatalogOpt, print_warnings
from k3deploy.errors import InputError


def render(
    file: Annotated[Path, typer.Argument(help="topology YAML file", show_default=False)],
    node: Annotated[int | None, typer.Option("--node", help="only this rank (text, json, script)")] = None,
    replica: Annotated[int | None, typer.Option("--replica", help="only this replica (with replicas)")] = None,
    role: Annotated[str | None, typer.Option("--role", help="only this role or instance (with roles): prefill, "
                                             "decode, prefill0, decode1, ...")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text | json | script | slurm | lws")] = "text",
    out: Annotated[Path | None, typer.Option("--out", help="write the files into DIR, not stdout")] = None,
    catalog: CatalogOpt = None,
) -> None:
    """Render each node's engine command. Exit 0 ok, 1 infeasible plan, 2 invalid input."""
    from k3deploy.engines.exports import stdout_text
    from k3deploy.engines.secret_refs import secret_warnings
    from k3deploy.planning.files import catalog_for, require_feasible
    from k3deploy.planning.rendering import render_files

    cat = catalog_for(catalog)
    plan = require_feasible(file, cat)
    print_warnings((*plan.issues, *secret_warnings(plan.topology, os.environ)), plan.file)
    vendor = cat.vendors.get(plan.hardware.vendor) if plan.hardware else None
    files = render_files(plan, fmt, node=node, replica=replica, role=role, vendor=vendor)  # type: ignore[arg-type]
    if out is None:
        sys.stdout.write(stdout_text(files))
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        for f in files:
            path = out / f.name
            path.write_text(f.content, encoding="utf-8")
            path.chmod(0o755 if f.executable else 0o644)
            print(path)
    except OSError as exc:
        raise InputError(f"--out {out}: {exc}") from exc
