"""The tokenizer mode and parsers come from the model's catalog entry: K3 keeps kimi_k3, a model without them
gets none (a Llama given K3's tokenizer mode and parsers would be served through the wrong chat format)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.catalog.specs import ChatParsers
from k3deploy.engines.render import render_nodes
from k3deploy.planning.plan import make_plan
from k3deploy.topology.loader import parse_topology
from tests.unit.test_render_support import doc_of, plan_of

FAST = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
PARSER_FLAGS = ("--tokenizer-mode", "--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice")


def _flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    """The parser flags in argv, each with its value (None for a switch)."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a in PARSER_FLAGS:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[a] = None if nxt.startswith("--") or not nxt else nxt
    return out


@FAST
@pytest.mark.parametrize("stem,want", [
    ("ascend-a3-4x16-vllm", {"--tokenizer-mode": "kimi_k3", "--reasoning-parser": "kimi_k3",
                             "--tool-call-parser": "kimi_k3", "--enable-auto-tool-choice": None}),
    ("h100-4x8-sglang", {"--reasoning-parser": "kimi_k3", "--tool-call-parser": "kimi_k3"}),
])
def test_k3_keeps_its_parsers(stem: str, want: dict[str, str | None]) -> None:
    for spec in render_nodes(plan_of(doc_of(stem)).render_inputs()):
        assert _flags(spec.argv) == want, spec.argv


@FAST
@pytest.mark.parametrize("stem", ["ascend-a3-4x16-vllm", "h100-4x8-sglang"])
def test_a_model_without_parsers_gets_none(stem: str) -> None:
    inp = plan_of(doc_of(stem)).render_inputs()
    bare = dataclasses.replace(inp, model=inp.model.model_copy(update={"parsers": ChatParsers()}))
    for spec in render_nodes(bare):
        assert _flags(spec.argv) == {}, spec.argv


@FAST
def test_the_test_catalogs_llama_gets_no_k3_flags(tmp_path: Path) -> None:
    catalog = load_catalog((ROOT / "tests" / "assets" / "catalog",))
    doc = {"name": "llama", "model": {"id": "tiny-llama", "path": str(tmp_path), "revision": "seed-0"},
           "hardware": {"gpu": "cpu-host", "gpus_per_node": 1},
           "nodes": [{"host": "localhost", "ip": "127.0.0.1", "iface": "lo"}],
           "engine": {"kind": "vllm", "port": 18000}, "parallel": {"tp": 1},
           "serving": {"context_length": 2048, "max_running_requests": 4}, "launch": {"executor": "local"}}
    plan = make_plan(parse_topology(yaml.safe_dump(doc), "t.yaml"), catalog)
    assert plan.feasible, [i.render("t.yaml") for i in plan.issues]
    (spec,) = render_nodes(plan.render_inputs())
    assert _flags(spec.argv) == {} and "kimi_k3" not in spec.argv, spec.argv
