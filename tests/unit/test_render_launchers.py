"""Every launcher form of every engine renders a command that form's parser accepts, with the model passed its way.

Golden files (tests/golden/launchers/<case>.txt) pin the rendered commands and plan warnings; regenerate
with `K3_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_render_launchers.py` and review the diff.
The acceptance check strips the docker wrapper and the launcher the case configured (known here, not
from k3deploy's recognition) and parses the rest with the form's data from the flag table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.exports import text_text
from k3deploy.engines.flag_tables import flag_table
from k3deploy.engines.launchers import resolve_launcher
from k3deploy.engines.render import render_nodes
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import parse_topology
from tests.unit.engine_parser_check import form_of, model_problems, parse, table
from tests.unit.test_render_support import ROOT, compare_golden, doc_of, plan_of, sim_doc

GOLDEN = ROOT / "tests" / "golden" / "launchers"
DIGEST = "@sha256:" + "cd" * 32
SG_LAUNCH = ["python3", "-m", "sglang.launch_server"]
VL_API = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
SIM = ["python3", "-m", "k3deploy.sim", "serve"]


@dataclass(frozen=True)
class Case:
    """One way of starting an engine: the topology, the form it is, the argv prefix it must render."""

    name: str
    doc: dict[str, Any]
    engine: str  # the flag table; "sim-<mimic>" for the stand-in
    form: str
    prefix: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())


def _sg(**patch: Any) -> dict[str, Any]:
    return doc_of("gb300-2x4-sglang", **patch)


def _vl(**patch: Any) -> dict[str, Any]:
    return doc_of("gb300-2x4-sglang", **{"engine.kind": "vllm", "engine.version": "0.33.0", **patch})


def _vl1(**patch: Any) -> dict[str, Any]:
    return doc_of("b300-1x8-sglang", **{"engine.kind": "vllm", "engine.version": "0.33.0", **patch})


CASES = [
    Case("sglang-serve", _sg(), "sglang", "sglang serve", ("sglang", "serve")),
    Case("sglang-serve-path", _sg(**{"engine.launcher": ["/opt/sglang/bin/sglang", "serve"]}), "sglang",
         "sglang serve", ("/opt/sglang/bin/sglang", "serve")),
    Case("sglang-bare-script", _sg(**{"engine.launcher": ["/opt/sglang/bin/sglang"]}), "sglang", "sglang serve",
         ("/opt/sglang/bin/sglang", "serve")),
    Case("sglang-launch-server", _sg(**{"engine.launcher": SG_LAUNCH}), "sglang",
         "python -m sglang.launch_server", tuple(SG_LAUNCH)),
    Case("sglang-launch-server-venv", _sg(**{"engine.launcher": ["/opt/venv/bin/python3.11", "-m",
                                                                  "sglang.launch_server"]}),
         "sglang", "python -m sglang.launch_server", ("/opt/venv/bin/python3.11", "-m", "sglang.launch_server")),
    Case("sglang-docker", _sg(**{"engine.image": "lmsysorg/sglang" + DIGEST}), "sglang", "sglang serve",
         ("sglang", "serve")),
    Case("sglang-docker-launch-server", _sg(**{"engine.image": "lmsysorg/sglang" + DIGEST,
                                               "engine.launcher": SG_LAUNCH}),
         "sglang", "python -m sglang.launch_server", tuple(SG_LAUNCH)),
    Case("sglang-unknown", _sg(**{"engine.launcher": ["/usr/local/bin/start-engine"]}), "sglang", "sglang serve",
         ("/usr/local/bin/start-engine",), ("LAUNCHER_UNKNOWN",)),
    Case("vllm-serve", _vl(), "vllm", "vllm serve", ("vllm", "serve")),
    Case("vllm-serve-path", _vl(**{"engine.launcher": ["/opt/vllm/bin/vllm", "serve"]}), "vllm", "vllm serve",
         ("/opt/vllm/bin/vllm", "serve")),
    Case("vllm-bare-script", _vl(**{"engine.launcher": ["/opt/vllm/bin/vllm"]}), "vllm", "vllm serve",
         ("/opt/vllm/bin/vllm", "serve")),
    Case("vllm-cli-module", _vl(**{"engine.launcher": ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]}),
         "vllm", "vllm serve", ("python3", "-m", "vllm.entrypoints.cli.main", "serve")),
    Case("vllm-api-server", _vl1(**{"engine.launcher": VL_API}), "vllm",
         "python -m vllm.entrypoints.openai.api_server", tuple(VL_API)),
    Case("vllm-docker", _vl(**{"engine.image": "vllm/vllm-openai" + DIGEST}), "vllm", "vllm serve",
         ("vllm", "serve")),
    Case("vllm-docker-api-server", _vl1(**{"engine.image": "vllm/vllm-openai" + DIGEST, "engine.launcher": VL_API}),
         "vllm", "python -m vllm.entrypoints.openai.api_server", tuple(VL_API)),
    Case("vllm-unknown", _vl(**{"engine.launcher": ["/usr/local/bin/start-engine", "--quiet"]}), "vllm",
         "vllm serve", ("/usr/local/bin/start-engine", "--quiet"), ("LAUNCHER_UNKNOWN",)),
    Case("vllm-ascend-docker", doc_of("ascend-a3-4x16-vllm", **{"engine.image": "quay.io/ascend/vllm-ascend" + DIGEST}),
         "vllm", "vllm serve", ("vllm", "serve")),
    Case("sim", sim_doc(), "sim-sglang", "sim", (*SIM, "--mimic", "sglang")),
    Case("sim-launcher", sim_doc(**{"engine.mimic": "vllm", "engine.launcher": ["/usr/bin/python3", "-m",
                                                                               "k3deploy.sim"]}),
         "sim-vllm", "sim", ("/usr/bin/python3", "-m", "k3deploy.sim", "serve", "--mimic", "vllm")),
]


def _plan_even_infeasible(doc: dict[str, Any]) -> Plan:
    return make_plan(parse_topology(yaml.safe_dump(doc, sort_keys=False), "t.yaml"), load_catalog())


def _engine_words(argv: tuple[str, ...]) -> list[str]:
    """The engine's argv: docker's `--entrypoint EXE IMAGE rest` becomes `EXE rest`."""
    if argv[0] != "docker":
        return list(argv)
    at = argv.index("--entrypoint")
    return [argv[at + 1], *argv[at + 3:]]


def golden_text(plan: Plan) -> str:
    warnings = [f"# plan {i.severity} {i.code}: {i.message}" for i in plan.issues if i.code.startswith("LAUNCHER")]
    return "\n".join(warnings + [text_text(render_nodes(plan.render_inputs()))])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_launcher_form_renders_what_its_parser_accepts(case: Case) -> None:
    plan = plan_of(case.doc)
    assert tuple(i.code for i in plan.issues if i.severity == "warning" and i.code.startswith("LAUNCHER")) == case.warnings
    model = plan.topology.model.path
    for spec in render_nodes(plan.render_inputs()):
        words = _engine_words(spec.argv)
        assert tuple(words[:len(case.prefix)]) == case.prefix, f"rank {spec.rank}: {words[:6]}"
        rest = words[len(case.prefix):]
        if case.engine.startswith("sim-"):  # the stand-in takes its mimicked engine's flags and a positional model
            tab = table(case.engine.removeprefix("sim-"))
            assert rest[0] == model and parse(rest[1:], tab)[1] == [], f"rank {spec.rank}"
            continue
        tab = table(case.engine)
        assert model_problems(rest, tab, form_of(tab, case.form), model) == [], f"rank {spec.rank}"
    compare_golden(GOLDEN / f"{case.name}.txt", golden_text(plan))


@pytest.mark.timeout(30)
def test_no_stale_launcher_golden_files() -> None:
    names = {c.name for c in CASES}
    stale = sorted(p.stem for p in GOLDEN.glob("*.txt") if p.stem not in names)
    assert not stale, f"golden files for launcher cases that no longer exist: {stale}"


@pytest.mark.timeout(30)
def test_the_checker_rejects_the_commands_issue_17_found() -> None:
    sg, vl = table("sglang"), table("vllm")
    launch_server = model_problems(["/models/K3", "--tp-size", "8"], sg, form_of(sg, "python -m sglang.launch_server"),
                                   "/models/K3")
    assert "stray value '/models/K3'" in launch_server
    assert "the following arguments are required: model_path" in launch_server
    api_server = model_problems(["/models/K3", "--tensor-parallel-size", "8"], vl,
                                form_of(vl, "python -m vllm.entrypoints.openai.api_server"), "/models/K3")
    assert api_server == ["the model is not passed with --model",
                          ("'/models/K3' is parsed into model_tag, which python -m "
                           "vllm.entrypoints.openai.api_server never reads")]
    serve_late = model_problems(["--tp-size", "8", "/models/K3"], sg, form_of(sg, "sglang serve"), "/models/K3")
    assert "stray value '/models/K3'" in serve_late  # `sglang serve` takes the model only first


@pytest.mark.timeout(60)
def test_multi_node_api_server_is_a_plan_error() -> None:
    doc = _vl(**{"engine.launcher": VL_API})
    plan = _plan_even_infeasible(doc)
    issue = next(i for i in plan.issues if i.code == "LAUNCHER_NO_HEADLESS")
    assert issue.severity == "error" and issue.path == "engine.launcher" and "vllm serve" in (issue.hint or "")
    assert not plan.feasible


@pytest.mark.timeout(30)
@pytest.mark.parametrize("launcher,form,known", [
    (["conda", "run", "-n", "sglang", "python", "-m", "sglang.launch_server"], "python -m sglang.launch_server", True),
    (["uv", "run", "sglang", "serve"], "sglang serve", True),
    (["sglang", "generate"], "sglang serve", False),
    (["python3", "-m", "sglang.cli.main", "serve"], "sglang serve", False),  # that module has no __main__
])
def test_launcher_recognition(launcher: list[str], form: str, known: bool) -> None:
    got = resolve_launcher(launcher, "sglang", flag_table("sglang"), "sglang")
    assert (got.form.name, got.known, got.prefix) == (form, known, tuple(launcher))


@pytest.mark.timeout(60)
def test_a_launcher_of_the_other_engine_is_a_plan_error() -> None:
    doc = _sg(**{"engine.launcher": ["/opt/venv/bin/vllm", "serve"]})
    plan = _plan_even_infeasible(doc)
    issue = next(i for i in plan.issues if i.code.startswith("LAUNCHER"))
    assert (issue.code, issue.severity, issue.path) == ("LAUNCHER_ENGINE_MISMATCH", "error", "engine.launcher")
    assert "`vllm serve`" in issue.message and "sglang" in issue.message
