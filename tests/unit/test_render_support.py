"""Helpers shared by the render tests (no tests here): real topology files, variants, plans."""
from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.files import require_feasible
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import parse_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
# Prefill/decode topologies render per instance (planning.pd.instance_inputs): test_pd_render.py, test_render_flags.py.
PD_TOPOLOGIES = [p for p in TOPOLOGIES if "\nroles:" in p.read_text(encoding="utf-8")]
FORMATS = ("text", "json", "script", "slurm", "lws")
UPDATE = os.environ.get("K3_UPDATE_GOLDEN") == "1"


def doc_of(stem: str, **patch: Any) -> dict[str, Any]:
    """A documented topology with dotted-path overrides, e.g. {'engine.image': ...}."""
    doc = yaml.safe_load((ROOT / "topologies" / f"{stem}.yaml").read_text())
    for dotted, value in patch.items():
        *parents, last = dotted.split(".")
        cur = doc
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[last] = copy.deepcopy(value)
    return doc


def plan_of(doc: dict[str, Any]) -> Plan:
    """Plan a topology dict through the real YAML loader; it must be feasible."""
    plan = make_plan(parse_topology(yaml.safe_dump(doc, sort_keys=False), "t.yaml"), load_catalog())
    assert plan.feasible, [i.render("t.yaml") for i in plan.issues if i.severity == "error"]
    return plan


def plan_file(path: Path) -> Plan:
    """A feasible plan of a real file."""
    return require_feasible(path, load_catalog())


def sim_doc(**patch: Any) -> dict[str, Any]:
    """A small stand-in deployment on loopback (plans and runs anywhere)."""
    doc: dict[str, Any] = {
        "name": "t-sim",
        "model": {"id": "kimi-k3-tiny", "path": "/tmp/k3/kimi-k3-tiny", "revision": "tiny-r1"},
        "hardware": {"gpu": "sim", "gpus_per_node": 1},
        "nodes": [{"host": "localhost", "ip": f"127.0.0.{i + 1}", "iface": "lo"} for i in range(4)],
        "engine": {"kind": "sim", "mimic": "sglang", "port": 18000},
        "parallel": {"tp": 4, "ep": 4},
        "serving": {"context_length": 32768, "max_running_requests": 16},
        "launch": {"executor": "local", "port": 29500},
    }
    for dotted, value in patch.items():
        *parents, last = dotted.split(".")
        cur = doc
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[last] = copy.deepcopy(value)
    return doc


def variants() -> dict[str, dict[str, Any]]:
    """Deployments beyond the documented files: the other engine forms, docker, launchers."""
    digest = "@sha256:" + "ab" * 32
    return {
        "vllm-h100-nnodes": doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "serving.max_running_requests": 32}),
        "vllm-b200-nnodes-dcp": doc_of("b200-2x8-sglang", **{"engine.kind": "vllm", "parallel.dcp": 8,
                                                             "serving.kv_cache_dtype": "fp8"}),
        "vllm-h200-dp": doc_of("h200-2x8-sglang", **{"engine.kind": "vllm", "engine.args": {},
                                                     "parallel.tp": 8, "parallel.dp": 2}),
        "sglang-h200-docker": doc_of("h200-4x8-sglang", **{"engine.image": "lmsysorg/sglang" + digest,
                                                           "engine.env": {"NCCL_DEBUG": "INFO"}}),
        "ascend-docker": doc_of("ascend-a3-4x16-vllm",
                                **{"engine.image": "quay.io/ascend/vllm-ascend" + digest}),
        "mi355x-dcp-docker": doc_of("mi355x-1x8-sglang",
                                    **{"parallel.dcp": 8, "engine.image": "rocm/sgl" + digest}),
        "sglang-pp-attn-dp": doc_of("h200-4x8-sglang",
                                    **{"parallel.pp": 2, "parallel.tp": 16, "parallel.ep": 16,
                                       "parallel.dp": 4, "parallel.attention_dp": True,
                                       "serving.prefix_cache": False}),
        "sim-vllm-dp": sim_doc(**{"engine.mimic": "vllm", "parallel.tp": 1, "parallel.dp": 4}),
        "sim-sglang-on-h100": doc_of("h100-4x8-sglang", **{"engine.kind": "sim", "engine.mimic": "sglang"}),
    }


CASES: list[tuple[str, Path | dict[str, Any]]] = [(p.stem, p) for p in TOPOLOGIES if p not in PD_TOPOLOGIES] + \
    list(variants().items())


def plan_for(source: Path | dict[str, Any]) -> Plan:
    """A feasible plan of a file or a variant dict."""
    return plan_file(source) if isinstance(source, Path) else plan_of(source)


def compare_golden(golden: Path, got: str) -> None:
    """got must equal the golden file; with K3_UPDATE_GOLDEN=1 it is written instead (review the diff)."""
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got, encoding="utf-8")
        return
    assert golden.exists(), f"no golden file {golden}: run with K3_UPDATE_GOLDEN=1 and review it"
    want = golden.read_text(encoding="utf-8")
    if got != want:
        lines = difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(golden), "rendered")
        diff = "".join(lines)
        pytest.fail(f"rendered output differs from {golden} (K3_UPDATE_GOLDEN=1 to accept):\n{diff}")
