"""What `validate` is pointed at (a topology, its file, its running deployment) and how it opens every node."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3deploy.records.deployment import Deployment
    from k3deploy.topology.schema import Topology
    from k3deploy.validate.stage import Nodes

# Opens "every node" for a topology (and its running deployment, if any): a NodeFleet.
RunnerFactory = Callable[["Topology", "Deployment | None"], AbstractContextManager["Nodes"]]


@dataclass(frozen=True)
class Target:
    """What `validate` was pointed at."""

    topology: Topology
    file: Path
    deployment: Deployment | None
    state_dir: Path | None = None  # where the deployment's records are (its effort measurements are kept there)
