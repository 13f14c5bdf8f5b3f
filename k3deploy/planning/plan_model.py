"""The frozen Plan (and, with roles, each role's plan): what make_plan hands every later stage. Pure data."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from k3deploy.catalog.specs import HardwareSpec, ModelSpec
from k3deploy.diagnostics import Issue
from k3deploy.engines.context import Disaggregation, Inputs
from k3deploy.engines.kinds import Family as EngineFamily
from k3deploy.engines.kinds import Flavour
from k3deploy.engines.shape import Shape
from k3deploy.errors import InfeasibleError
from k3deploy.planning.capacity import Capacity
from k3deploy.planning.memory import MemoryBudget
from k3deploy.planning.pool import Pool, RouterPlan
from k3deploy.planning.vision import VisionPlan
from k3deploy.topology.replicas import replica_topology
from k3deploy.topology.schema import Topology
from k3deploy.topology.settings import Serving, ValidateSettings
from k3deploy.topology.units import UnitInstance, UnitLayout

# Mistakes in the file itself, whatever the hardware can do (exit 2, like a schema error); every other
# error is a shape or budget that cannot run (exit 1).
INPUT_CODES = frozenset({"UNKNOWN_MODEL", "UNKNOWN_HARDWARE", "RANKS_PARTIAL", "RANKS_DUPLICATE", "RANKS_GAP",
                         "IP_UNSPECIFIED", "IP_LOOPBACK", "DUPLICATE_IP", "DUPLICATE_HOST",
                         "ROUTER_POLICY", "PD_ROUTER_KIND", "PD_OWNED_FLAG", "PD_SIDE_CHANNEL_ENV",
                         "PD_DECODE_LAYOUT_FLAG",
                         # settings the model or the engine cannot take at all (the seeds' failure modes)
                         "CONTEXT_OVER_MODEL", "ROPE_OVERRIDE_NOPE", "MM_CUDA_IPC_MULTINODE", "VLLM_MAX_NUM_SEQS",
                         "SPEC_DRAFT_TOKENS", "SPEC_DRAFT_METHOD", "SPEC_DRAFT_TARGET"})


# Topology fields added after deployments were recorded: at their defaults they stay out of the digest, so a
# record made before them still matches its topology (vision and the accuracy stage, session 14).
LATER_FIELDS = (("serving", Serving, ("images_per_request",)),
                ("validate", ValidateSettings, ("accuracy_dataset", "accuracy_task", "accuracy_max_tokens",
                                                "accuracy_limit")))


class UnitFacts(NamedTuple):
    """What the topology and the engines say of a unit, asked once before any check reads it: its layout (each
    instance with its own topology, nodes and ports; the router's node; the PD transfer family), the router's
    worker URLs, the engine's family and flavour, the router's policies and whether it has a PD mode, and each
    role's parallel shape."""

    layout: UnitLayout
    family: EngineFamily
    flavour: Flavour | None  # None: the accelerator is unknown
    router_policies: tuple[str, ...]  # the policies the router has (empty: no router)
    router_pd: bool  # whether the router has a prefill/decode mode
    worker_urls: tuple[str, ...]  # each instance's engine URL (empty without a router)
    shapes: Mapping[str, Shape]  # by role ("": a replica or a deployment); empty while the shape cannot be made


class Plan(NamedTuple):
    """Everything later stages need: the topology, catalog entries, shape, budget and verdict."""

    file: str
    topology: Topology
    model: ModelSpec | None
    hardware: HardwareSpec | None
    family: EngineFamily
    shape: Shape | None
    memory: MemoryBudget | None
    capacity: Capacity | None
    issues: tuple[Issue, ...]
    pool: Pool | None = None  # with replicas or a router: what all replicas hold together
    router: RouterPlan | None = None
    pd: PdPlan | None = None  # with roles: each role's plan (the fields above are decode's)
    vision: VisionPlan | None = None  # the vision tower per GPU (None: a text-only model, or no shape)
    instances: tuple[UnitInstance, ...] = ()  # the unit's instances, as planned (a deployment: its one)

    @property
    def valid(self) -> bool:
        """No mistake in the file itself (exit 2): ids the catalog knows, a usable node list."""
        return self.model is not None and self.hardware is not None and not any(
            i.code in INPUT_CODES and i.severity == "error" for i in self.issues)

    @property
    def feasible(self) -> bool:
        """No error-severity issue."""
        return self.valid and not any(i.severity == "error" for i in self.issues)

    def render_inputs(self, python: str = "python3", replica: int = 0) -> Inputs:
        """What the renderers take from a feasible plan (for one replica: its nodes and ports);
        InfeasibleError naming the codes otherwise. `python` runs the stand-in engine (kind sim without
        engine.launcher)."""
        if self.pd is not None:  # each instance has its own shape and nodes: planning.pd.instance_inputs
            self._require_feasible()
            raise ValueError("a plan with roles renders per instance (planning.pd.instance_inputs)")
        return self._inputs(replica_topology(self.topology, replica), python)

    def instance_inputs(self, inst: UnitInstance, python: str = "python3") -> Inputs:
        """What the renderers take for one of the plan's instances (with roles: its role's plan, and the cache
        transfer it takes part in); InfeasibleError as render_inputs."""
        if self.pd is None:
            return self._inputs(inst.topology, python)
        t = self.topology
        assert t.roles is not None
        role = self.pd.prefill if inst.role == "prefill" else self.pd.decode
        d = Disaggregation(mode=inst.role, backend=self.pd.backend, bootstrap_port=inst.bootstrap_port,
                           side_channel_port=inst.side_channel_port,
                           ib_devices=tuple(t.roles.transfer.ib_devices or ()))
        return dataclasses.replace(role.plan._inputs(inst.topology, python), pd=d)

    def _require_feasible(self) -> None:
        if not self.feasible or self.model is None or self.hardware is None or self.shape is None \
                or self.memory is None:
            codes = ", ".join(i.code for i in self.issues if i.severity == "error") or "incomplete plan"
            raise InfeasibleError(f"{self.file}: cannot render an infeasible plan ({codes})",
                                  hint=f"run `k3deploy plan {self.file}`")

    def _inputs(self, t: Topology, python: str) -> Inputs:
        """The renderers' inputs of one deployment of this plan's shape and budget on topology `t`."""
        self._require_feasible()
        assert self.model is not None and self.hardware is not None and self.shape is not None \
            and self.memory is not None
        return Inputs(topology=t, model=self.model, hardware=self.hardware, shape=self.shape,
                      mem_fraction=self.memory.mem_fraction,
                      pool_ratio=self.memory.pool_ratio if t.serving.mamba_full_memory_ratio is not None else None,
                      python=python)

    def digest(self) -> str:
        """A stable hash of the topology (what a deployment record pins)."""
        import hashlib  # only launch needs it; OpenSSL's start-up cost stays off the `plan` path

        doc = self.topology.model_dump(mode="json", by_alias=True)
        # Sections added later enter the hash only when used, so a record made before them still matches.
        for key, unset in (("replicas", 1), ("replica_nodes", None), ("router", None), ("roles", None)):
            if doc.get(key) == unset:
                doc.pop(key)
        for section, model, keys in LATER_FIELDS:  # and so do fields added later, at their defaults
            for key in keys:
                if isinstance(doc.get(section), dict) and doc[section].get(key) == model.model_fields[key].default:
                    doc[section].pop(key, None)
        slurm = doc.get("launch", {}).get("slurm")
        if isinstance(slurm, dict) and not any(v is not None for v in slurm.values()):
            doc["launch"].pop("slurm")
        blob = json.dumps(doc, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class RolePlan(NamedTuple):
    """One role: its instance count and the plan of one instance (shape, memory, capacity)."""

    role: str
    instances: int
    gpus_per_instance: int
    plan: Plan

    def model_dump(self) -> dict[str, Any]:
        """The `plan --json` object of one role."""
        p, m = self.plan, self.plan.memory
        return {"role": self.role, "instances": self.instances, "gpus_per_instance": self.gpus_per_instance,
                "shape": p.shape.model_dump() if p.shape else None,
                "capacity": p.capacity.model_dump() if p.capacity else None,
                "memory_per_gpu": None if m is None else {
                    "weights_bytes": m.weights_bytes, "reserve_bytes": m.reserve_bytes,
                    "kv_pool_bytes": m.kv_pool_bytes, "state_pool_bytes": m.state_pool_bytes}}


class PdPlan(NamedTuple):
    """Both roles and what they hold together."""

    backend: str
    prefill: RolePlan
    decode: RolePlan

    def model_dump(self) -> dict[str, Any]:
        """The `plan --json` roles object: each role, and the pool (decode holds the serving cache)."""
        d = self.decode
        cap = d.plan.capacity
        return {"backend": self.backend, "prefill": self.prefill.model_dump(), "decode": d.model_dump(),
                "pool": {"gpus": sum(r.instances * r.gpus_per_instance for r in (self.prefill, d)),
                         "decode_kv_tokens": d.instances * cap.kv_tokens if cap else None,
                         "decode_concurrent_requests": d.instances * cap.max_running_requests if cap else None}}
