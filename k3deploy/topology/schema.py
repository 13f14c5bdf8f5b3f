"""The topology file schema: one strict, frozen pydantic model per section (sections in base, nodes, engine,
settings), and the document that holds them."""
# No `from __future__ import annotations` here: pydantic would compile every annotation string when the
# classes are created, on the start-up path of every command.
from pydantic import ConfigDict, Field, field_validator

from k3deploy.topology.base import PATH_MAX, Strict
from k3deploy.topology.engine import Engine
from k3deploy.topology.nodes import Node
from k3deploy.topology.roles import Roles
from k3deploy.topology.router import Router
from k3deploy.topology.settings import Launch, Parallel, Serving, ValidateSettings


class ModelRef(Strict):
    """Which checkpoint, where it lives on every node, and which revision."""

    id: str = Field(description="model catalog id, e.g. kimi-k3, kimi-k3-w4a8, kimi-k3-tiny")
    path: str = Field(max_length=PATH_MAX,
                      description="absolute path of the checkpoint on every node (identical everywhere)")
    revision: str | None = Field(None, description="pinned hub revision (commit sha) of the checkpoint")

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or "\x00" in v or "\n" in v:
            raise ValueError("must be an absolute path without NUL or newline")
        return v


class HardwareRef(Strict):
    """Which accelerator, and how many per node."""

    gpu: str = Field(description="hardware catalog id, e.g. h100-80gb, b200, mi355x, ascend-a3, sim")
    gpus_per_node: int = Field(ge=1, le=64, description="accelerators per node used by the engine")


class Topology(Strict):
    """A Kimi K3 deployment: model, hardware, nodes, engine, replicas or roles, router, parallelism, serving, launch."""

    name: str = Field(description="deployment name (letters, digits, - _ .)", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    model: ModelRef = Field(description="the checkpoint")
    hardware: HardwareRef = Field(description="accelerator type and count per node")
    nodes: list[Node] = Field(min_length=1, description="nodes; rank = list order unless `rank` is set")
    engine: Engine = Field(description="serving engine")
    replicas: int = Field(1, ge=1, le=256, description="copies of the shape, each on its own nodes (replica i "
                          "serves on engine.port + i and rendezvouses on launch.port + i)")
    replica_nodes: list[list[str]] | None = Field(
        None, description="the node hosts of each replica, one list per replica in rank order (default: the "
        "node list cut in order into `replicas` equal groups)")
    router: Router | None = Field(None, description="the router in front of the replicas (with roles: in PD mode)")
    roles: Roles | None = Field(None, description="prefill/decode disaggregation: prefill and decode instances "
                                "(xPyD) on their own nodes, the transfer between them; needs `router`")
    parallel: Parallel = Field(default_factory=Parallel, description="parallelism")
    serving: Serving = Field(default_factory=Serving, description="serving and memory settings")
    launch: Launch = Field(default_factory=Launch, description="launch settings")
    validate_: ValidateSettings = Field(
        default_factory=ValidateSettings, alias="validate", description="validation thresholds"
    )

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, populate_by_name=True)

    def ordered_nodes(self) -> list[tuple[int, Node]]:
        """Nodes with their rank, rank 0 first."""
        ranked = [(n.rank if n.rank is not None else i, n) for i, n in enumerate(self.nodes)]
        return sorted(ranked, key=lambda rn: rn[0])
