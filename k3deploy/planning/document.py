"""The stable `plan --json` documents (no rich import: `--json` and `--check` never draw tables)."""
from __future__ import annotations

from typing import Any

from k3deploy.diagnostics import Issue
from k3deploy.planning.plan import Plan
from k3deploy.planning.search import ShapeRow

SCHEMA_VERSION = 1
_MEM_FIELDS = ("usable_bytes", "weights_bytes", "routed_weights_bytes", "non_expert_weights_bytes",
               "reserve_bytes", "kv_pool_bytes", "state_pool_bytes", "headroom_bytes", "engine_static_bytes",
               "engine_preload_bytes", "vision_bytes")


def plan_json(plan: Plan) -> dict[str, Any]:
    """The `plan --json` object for one file (documented in README; fields only ever get added)."""
    m = plan.memory
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "file": plan.file,
        "name": plan.topology.name,
        "valid": plan.valid,
        "feasible": plan.feasible,
        "engine": plan.topology.engine.kind,
        "issues": [i.model_dump() for i in plan.issues],
        "shape": plan.shape.model_dump() if plan.shape else None,
        "memory_per_gpu": None,
        "per_token": None,
        "per_request": None,
        "capacity": plan.capacity.model_dump() if plan.capacity else None,
        "pool": plan.pool.model_dump() if plan.pool else None,
        "router": plan.router.model_dump() if plan.router else None,
        "roles": plan.pd.model_dump() if plan.pd else None,
        "vision": plan.vision.model_dump() if plan.vision else None,
    }
    if m is not None:
        doc["memory_per_gpu"] = {f: getattr(m, f) for f in _MEM_FIELDS} | {
            "mem_fraction": m.mem_fraction, "pool_ratio": m.pool_ratio, "block_tokens": m.block_tokens}
        doc["per_token"] = {"mla_kv_bytes": m.mla_kv_bytes_per_token}
        doc["per_request"] = {"kda_state_bytes": m.kda_state_bytes_per_slot, "slots": m.slots_per_request,
                              "kda_state_bytes_all_slots": m.kda_state_bytes_per_slot * m.slots_per_request}
    return doc


def invalid_json(file: str, issues: list[Issue]) -> dict[str, Any]:
    """The `plan --json` object for a file that did not load."""
    return {"schema_version": SCHEMA_VERSION, "file": file, "name": None, "valid": False, "feasible": False,
            "engine": None, "issues": [i.model_dump() for i in issues], "shape": None, "memory_per_gpu": None,
            "per_token": None, "per_request": None, "capacity": None, "pool": None, "router": None, "roles": None}


def search_json(hardware: str, gpus: int, engine: str, rows: list[ShapeRow], model: str | None = None
                ) -> dict[str, Any]:
    """The `plan --search --json` document."""
    return {"hardware": hardware, "gpus": gpus, "engine": engine, "model": model,
            "shapes": [r.model_dump() for r in rows]}
