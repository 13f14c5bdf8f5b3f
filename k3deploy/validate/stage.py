"""What every validation stage shares: its result, the context it runs in, and the fixed stage order."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.verdicts.model import NodeRow, Status

if TYPE_CHECKING:
    from k3deploy.catalog.specs import Catalog, ModelSpec
    from k3deploy.checkpoint.manifest import Manifest
    from k3deploy.executors.base import Executor
    from k3deploy.records.deployment import Deployment
    from k3deploy.topology.schema import Topology

# The deployment guides' checklist, in order (k3deploy.validate.stages implements each).
STAGE_NAMES: tuple[str, ...] = ("shards", "kernels", "topology", "short", "vision", "long", "prefix-cache", "effort",
                                 "accuracy")


class StageResult(BaseModel):
    """One stage's outcome: status, a one-line detail, per-node rows, time taken and the deciding evidence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="stage name (see STAGE_NAMES)")
    status: Status = Field(description="pass | fail | skip | error")
    detail: str = Field(description="one line for humans")
    seconds: float = Field(0.0, description="wall time of the stage (the pipeline measures it)")
    nodes: list[NodeRow] = Field(default_factory=list, description="per-node rows (empty for cluster-wide stages)")
    evidence: str = Field("", description="the log line, response or finding that decided the status")
    results: dict[str, Any] = Field(default_factory=dict, description="measurements (effort: per workload, under "
                                    "`vllm bench serve` result names where they mean the same)")


@dataclass(frozen=True)
class ProgressEvent:
    """A node's progress within a stage (bytes hashed so far, of total)."""

    stage: str
    rank: int
    host: str
    done: int
    total: int
    elapsed_s: float


class ProbeOutcome(Protocol):
    """One node's answer to a probe: the parsed JSON of its last stdout line, or the error naming the host."""

    @property
    def ok(self) -> bool: ...

    @property
    def value(self) -> Any: ...

    @property
    def error(self) -> Exception | None: ...


class Nodes(Protocol):
    """Every node of the deployment (a NodeFleet): probes shipped by source, and each node's executor (its
    logs, a port forwarded from rank 0)."""

    def run_probe(self, module: ModuleType, args: Sequence[str] = (), *, timeout_s: float = 60.0,
                  on_line: Callable[[int, str], None] | None = None) -> Mapping[int, ProbeOutcome]:
        """Ship a stdlib-only module by source to `python3 -c` on every node; each node's value is the JSON
        of its last stdout line, earlier lines reach on_line(rank, line)."""
        ...

    def executor(self, rank: int) -> Executor:
        """The executor of one node."""
        ...


@dataclass(frozen=True)
class NodeRef:
    """A node as reports name it."""

    rank: int
    host: str


Mark = tuple[int, "dict[str, float] | None"]


class Served(Protocol):
    """Who served the requests a stage sent, as results name them."""

    def on_reply(self, path: str, headers: Mapping[str, str]) -> None:
        """A NodeHttp reply hook."""

    def mark(self) -> Mark:
        """Where the record stands now."""

    def since(self, mark: Mark, expect: int = 1) -> list[str]:
        """Who served since `mark`."""

    def served(self, result: StageResult, names: list[str]) -> StageResult:
        """The stage's result naming who served its requests."""

    def kept_together(self, result: StageResult, who: list[list[str]], answered: bool) -> StageResult:
        """The prefix-cache result judged by who served each turn (`who`, one list per turn)."""


class Alone:
    """A deployment alone: it serves every request itself, so nothing is noted and results stay as they are."""

    def on_reply(self, path: str, headers: Mapping[str, str]) -> None:
        """Nothing to note: no router names a worker."""

    def mark(self) -> Mark:
        """Nothing is recorded."""
        return 0, None

    def since(self, mark: Mark, expect: int = 1) -> list[str]:
        """Nobody is named: the deployment served them all."""
        return []

    def served(self, result: StageResult, names: list[str]) -> StageResult:
        """The result as it is."""
        return result

    def kept_together(self, result: StageResult, who: list[list[str]], answered: bool) -> StageResult:
        """The result as it is: the one deployment served both turns."""
        return result


ALONE = Alone()  # it keeps nothing: one serves every deployment alone


@dataclass
class ValidateContext:
    """Everything a stage may use; stages that need a running deployment skip when `deployment` is None."""

    name: str
    topology: Topology
    model: ModelSpec
    nodes: list[NodeRef]
    fleet: Nodes
    manifest: Manifest | None = None
    deployment: Deployment | None = None
    catalog: Catalog | None = None  # the catalog the topology was checked against (None: the packaged one)
    progress: Callable[[ProgressEvent], None] = field(default=lambda event: None)
    routed: Served = ALONE  # who served the requests (through a router: noted)

    @property
    def run_probe(self) -> Callable[..., Mapping[int, ProbeOutcome]]:
        """The fleet's probe runner."""
        return self.fleet.run_probe

    def host(self, rank: int) -> str:
        """The host of a rank (the rank itself when the topology has no such node)."""
        return next((n.host for n in self.nodes if n.rank == rank), f"rank {rank}")


class Stage(Protocol):
    """A named validation step."""

    name: str
    needs_deployment: bool

    def run(self, ctx: ValidateContext) -> StageResult:
        """Check one thing and say what was found (never raises for a finding; K3Error for broken input)."""
        ...
