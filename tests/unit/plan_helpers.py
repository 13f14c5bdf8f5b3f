"""Build topologies in tests from small dicts, through the real YAML loader."""
from __future__ import annotations

import copy
from typing import Any

import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.planning.plan import Plan, make_plan
from k3deploy.topology.loader import parse_topology


def topology_dict(*, gpu: str = "h100-80gb", per_node: int = 8, nodes: int = 4, kind: str = "sglang",
                  tp: int = 32, ep: int = 32, dp: int = 1, pp: int = 1, dcp: int = 1, model: str = "kimi-k3",
                  **serving: Any) -> dict[str, Any]:
    """A valid topology dict; override pieces in tests."""
    return {
        "name": "t",
        "model": {"id": model, "path": "/models/Kimi-K3", "revision": "abc123"},
        "hardware": {"gpu": gpu, "gpus_per_node": per_node},
        "nodes": [{"host": f"n{i}", "ip": f"10.0.0.{10 + i}", "iface": "ens-priv"} for i in range(nodes)],
        "engine": {"kind": kind},
        "parallel": {"tp": tp, "ep": ep, "dp": dp, "pp": pp, "dcp": dcp},
        "serving": {"context_length": 131072, "max_running_requests": 32, **serving},
    }


def plan_of(doc: dict[str, Any]) -> Plan:
    """Plan a topology dict via YAML text, so positions exist."""
    return make_plan(parse_topology(yaml.safe_dump(copy.deepcopy(doc), sort_keys=False), "t.yaml"), load_catalog())


def codes(plan: Plan) -> set[str]:
    """Error codes of a plan."""
    return {i.code for i in plan.issues if i.severity == "error"}
