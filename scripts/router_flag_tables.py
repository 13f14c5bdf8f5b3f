"""Regenerate k3deploy/engines/data/routers/*.json from the routers' real argument parsers.

Run it with the routers venv's interpreter (scripts/routers_venv.sh makes it):

    "$(bash scripts/routers_venv.sh)/bin/python" scripts/router_flag_tables.py

Each router's `python -m PACKAGE.launch_router` builds its parser as `RouterArgs.add_cli_args(parser)` (read
from each package's launch_router.parse_router_args); the same call is made here and every argument dumped
(spellings, dest, whether it takes a value, type, nargs, choices, default).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "k3deploy" / "engines" / "data" / "routers"
# router kind -> (PyPI distribution, version k3deploy pins, package whose launch_router module starts it)
ROUTERS = {"smg": ("smg", "1.13.0", "smg"),
           "sglang-router": ("sglang-router", "0.3.2", "sglang_router"),
           "vllm-router": ("vllm-router", "0.1.17", "vllm_router")}


def _default(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
        return list(value)
    return repr(value)


def _entry(a: argparse.Action) -> dict[str, Any]:
    e: dict[str, Any] = {"flags": list(a.option_strings), "dest": a.dest, "takes_value": a.nargs != 0}
    if a.type is not None:
        e["type"] = getattr(a.type, "__name__", type(a.type).__name__)
    e["default"] = _default(a.default)
    if a.choices is not None:  # sorted: some come from the Rust side in hash order (sglang-router's parsers)
        e["choices"] = sorted(str(c) for c in a.choices)
    if a.nargs not in (None, 0):
        e["nargs"] = a.nargs
    return e


def table(kind: str) -> dict[str, Any]:
    """The flag table of one router, from its installed package."""
    dist, version, package = ROUTERS[kind]
    installed = importlib.metadata.version(dist)
    if installed != version:
        sys.exit(f"{dist} {installed} is installed, the tables pin {version}: run scripts/routers_venv.sh")
    launcher = importlib.import_module(f"{package}.launch_router")
    if "RouterArgs.add_cli_args(parser" not in inspect.getsource(launcher.parse_router_args):
        sys.exit(f"{package}.launch_router.parse_router_args no longer builds its parser with "
                 "RouterArgs.add_cli_args: read it again and update this script")
    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"{package}.router_args").RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return {"router": f"{kind} {version}", "distribution": dist, "module": f"{package}.launch_router",
            "source": f"{package}.router_args.RouterArgs.add_cli_args (scripts/router_flag_tables.py)",
            "arguments": [_entry(a) for a in parser._actions if a.option_strings]}


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for kind, (_, version, _) in ROUTERS.items():
        out = DATA / f"{kind}-{version}.json"
        out.write_text(json.dumps(table(kind), indent=1) + "\n", encoding="utf-8")
        print(out)


if __name__ == "__main__":
    main()
