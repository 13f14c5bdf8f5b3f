"""Every rendered flag and choice value exists in the pinned engine's flag table (engines/data/*.json).

The checker (tests/unit/engine_parser_check.py) reads the JSON itself, independent of
k3deploy.engines.flag_tables, so a renderer bug and a table-loading bug cannot cancel out.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.engines.render import render_nodes
from k3deploy.engines.spec import LaunchSpec
from k3deploy.planning.pd import instance_inputs
from k3deploy.topology.pd import instances
from tests.unit.engine_parser_check import check, table
from tests.unit.test_render_support import CASES, PD_TOPOLOGIES, ROOT, plan_for

FAST = pytest.mark.timeout(60)
PREFIXES = {("sglang", "serve"): "sglang", ("vllm", "serve"): "vllm"}


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
    for spec in render_nodes(plan.render_inputs()):
        engine, flags = engine_part(spec, plan.topology.model.path)
        assert check(flags, table(engine)) == [], f"rank {spec.rank}"
        assert len([f for f in flags if f.startswith("--")]) >= 15


@FAST
@pytest.mark.parametrize("name,source", CASES, ids=[c[0] for c in CASES])
def test_parsers_are_kimi_k3_and_known(name: str, source: Path | dict) -> None:
    plan = plan_for(source)
    for spec in render_nodes(plan.render_inputs()):
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


@FAST
@pytest.mark.parametrize("path", [*PD_TOPOLOGIES, ROOT / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"],
                         ids=lambda p: p.stem)
def test_every_rendered_pd_flag_and_choice_exists(path: Path) -> None:
    plan = plan_for(path)
    assert plan.pd is not None
    for inst in instances(plan.topology):
        for spec in render_nodes(instance_inputs(plan, inst)):
            engine, flags = engine_part(spec, plan.topology.model.path)
            assert check(flags, table(engine)) == [], f"{inst.role}{inst.index} rank {spec.rank}"
            assert ("--kv-transfer-config" in flags) == (engine == "vllm")
            assert ("--disaggregation-mode" in flags) == (engine == "sglang")
