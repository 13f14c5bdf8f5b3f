"""Every rendered flag and choice value exists in the pinned engine's flag table (engines/data/*.json).

The checker here reads the JSON itself, independent of k3deploy.engines.flag_tables, so a renderer bug and
a table-loading bug cannot cancel out.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3deploy.engines.render import render_nodes
from k3deploy.engines.spec import LaunchSpec
from tests.unit.test_render_support import CASES, ROOT, plan_for

FAST = pytest.mark.timeout(60)
TABLES = {"sglang": ROOT / "k3deploy/engines/data/sglang-0.5.23.json",
          "vllm": ROOT / "k3deploy/engines/data/vllm-0.33.0.json"}
PREFIXES = {("sglang", "serve"): "sglang", ("vllm", "serve"): "vllm"}


def table(name: str) -> dict[str, Any]:
    return json.loads(TABLES[name].read_text())


def check(args: list[str], tab: dict[str, Any]) -> list[str]:
    """Problems argparse (or vLLM's start-up registry check) would have with these flags."""
    by_flag = {f: a for a in tab["arguments"] for f in a["flags"]}
    registries = {k: v for k, v in tab.get("registries", {}).items() if isinstance(v, list)}
    problems: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-"):
            problems.append(f"stray value {tok!r}")
            continue
        arg = by_flag.get(tok)
        if arg is None:
            problems.append(f"{tok} is not a flag of {tab['engine']}")
            continue
        if not arg["takes_value"]:
            continue
        nargs = arg.get("nargs")
        values: list[str] = []
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
            if nargs not in ("+", "*"):
                break
        if not values and nargs not in ("?", "*"):
            problems.append(f"{tok} is missing its value")
        allowed = arg.get("choices") or registries.get(arg["dest"])
        for v in values:
            if allowed is not None and v not in allowed:
                problems.append(f"{tok} {v}: not one of its choices")
    return problems


def engine_part(spec: LaunchSpec, model_path: str) -> tuple[str, list[str]]:
    """(flag table, flags after the model path), past any docker wrapper and launcher."""
    argv = list(spec.argv)
    if argv[0] == "docker":
        entry = argv.index("--entrypoint")
        argv = [argv[entry + 1], *argv[entry + 3:]]  # --entrypoint EXE IMAGE rest...
    at = argv.index(model_path)
    prefix = tuple(argv[:at])
    if prefix[:4] == ("python3", "-m", "k3deploy.sim", "serve"):
        assert prefix[4] == "--mimic" and len(prefix) == 6
        return prefix[5], argv[at + 1:]
    assert prefix in PREFIXES, prefix
    return PREFIXES[prefix], argv[at + 1:]


@FAST
@pytest.mark.parametrize("name,source", CASES, ids=[c[0] for c in CASES])
def test_every_rendered_flag_and_choice_exists(name: str, source: Path | dict) -> None:
    plan = plan_for(source)
    for spec in render_nodes(plan):
        engine, flags = engine_part(spec, plan.topology.model.path)
        assert check(flags, table(engine)) == [], f"rank {spec.rank}"
        assert len([f for f in flags if f.startswith("--")]) >= 15


@FAST
@pytest.mark.parametrize("name,source", CASES, ids=[c[0] for c in CASES])
def test_parsers_are_kimi_k3_and_known(name: str, source: Path | dict) -> None:
    plan = plan_for(source)
    for spec in render_nodes(plan):
        engine, flags = engine_part(spec, plan.topology.model.path)
        tab = table(engine)
        for flag in ("--reasoning-parser", "--tool-call-parser"):
            value = flags[flags.index(flag) + 1]
            assert value == "kimi_k3"
            arg = next(a for a in tab["arguments"] if flag in a["flags"])
            assert value in (arg.get("choices") or tab["registries"][arg["dest"]])
        if engine == "vllm":
            assert "--enable-auto-tool-choice" in flags  # the tool parser is used only with auto tool choice


@FAST
def test_the_checker_catches_missing_flags_and_bad_choices() -> None:
    sg, vl = table("sglang"), table("vllm")
    assert check(["--tokenizer-mode", "kimi_k3"], sg) == ["--tokenizer-mode kimi_k3: not one of its choices"]
    assert check(["--quantization", "ascend"], sg) == ["--quantization ascend: not one of its choices"]
    assert check(["--no-such-flag"], sg) == ["--no-such-flag is not a flag of sglang 0.5.23"]
    assert check(["--reasoning-parser", "kimi_k9"], vl) == \
        ["--reasoning-parser kimi_k9: not one of its choices"]
    assert check(["--moe-backend", "marlin", "--enable-expert-parallel", "--tp-size", "8"], vl) == \
        ["--tp-size is not a flag of vllm 0.33.0", "stray value '8'"]
    assert check(["--served-model-name", "a", "b"], vl) == []
