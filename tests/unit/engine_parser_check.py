"""An engine's argument parser as its flag table describes it (no tests here): accept or reject argv.

Reads the JSON tables itself, independent of k3deploy.engines.flag_tables, so a renderer bug and a
table-loading bug cannot cancel out.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"sglang": ROOT / "k3deploy/engines/data/sglang-0.5.23.json",
          "vllm": ROOT / "k3deploy/engines/data/vllm-0.33.0.json"}
# A form with no positionals and nothing required: the flags alone.
FLAGS_ONLY: dict[str, Any] = {"name": "flags only", "model": "-", "positionals": [], "required": []}


def table(name: str) -> dict[str, Any]:
    return json.loads(TABLES[name].read_text())


def form_of(tab: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in tab["forms"] if f["name"] == name)


def _values(args: list[str], i: int, nargs: str | None) -> list[str]:
    out: list[str] = []
    while i < len(args) and not args[i].startswith("--"):
        out.append(args[i])
        i += 1
        if nargs not in ("+", "*"):
            break
    return out


def parse(args: list[str], tab: dict[str, Any], form: dict[str, Any] = FLAGS_ONLY) -> tuple[dict[str, Any], list[str]]:
    """(dest -> values, problems) as the form's parser (or vLLM's start-up registry check) sees args."""
    by_flag = {f: a for a in tab["arguments"] for f in a["flags"]}
    registries = {k: v for k, v in tab.get("registries", {}).items() if isinstance(v, list)}
    positionals = list(form["positionals"])
    got: dict[str, Any] = {}
    problems: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-"):
            slot = positionals[0] if positionals and (i == 0 or not positionals[0].get("first")) else None
            if slot is None:
                problems.append(f"stray value {tok!r}")
            else:
                got[positionals.pop(0)["dest"]] = [tok]
            i += 1
            continue
        i += 1
        arg = by_flag.get(tok)
        if arg is None:
            problems.append(f"{tok} is not a flag of {tab['engine']}")
            continue
        if not arg["takes_value"]:
            got[arg["dest"]] = True
            continue
        nargs = arg.get("nargs")
        values = _values(args, i, nargs)
        i += len(values)
        if not values and nargs not in ("?", "*"):
            problems.append(f"{tok} is missing its value")
        allowed = arg.get("choices") or registries.get(arg["dest"])
        problems += [f"{tok} {v}: not one of its choices" for v in values if allowed is not None and v not in allowed]
        got[arg["dest"]] = values
    missing = [d for d in form["required"] if d not in got]
    if missing:
        problems.append(f"the following arguments are required: {', '.join(missing)}")
    return got, problems


def check(args: list[str], tab: dict[str, Any]) -> list[str]:
    """Problems with a list of flags alone."""
    return parse(args, tab)[1]


def model_problems(args: list[str], tab: dict[str, Any], form: dict[str, Any], model: str) -> list[str]:
    """Parser problems, plus: the model path must reach the engine the way this form reads it."""
    got, problems = parse(args, tab, form)
    if form["model"] == "positional":
        dest = form["positionals"][0]["dest"]
        if got.get(dest) != [model]:
            problems.append(f"the model is not the positional {dest}")
        return problems
    dest = next(a["dest"] for a in tab["arguments"] if form["model"] in a["flags"])
    if got.get(dest) != [model]:
        problems.append(f"the model is not passed with {form['model']}")
    problems += [f"{got[p['dest']][0]!r} is parsed into {p['dest']}, which {form['name']} never reads"
                 for p in form["positionals"] if p["dest"] in got]
    return problems
