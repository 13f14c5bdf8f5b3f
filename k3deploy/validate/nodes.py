"""Every node of a topology (or of its running deployment) as one NodeFleet."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3deploy.records.deployment import Deployment
    from k3deploy.topology.schema import Topology
    from k3deploy.validate.stage import Nodes


@contextlib.contextmanager
def fleet_runner(topology: Topology, deployment: Deployment | None) -> Iterator[Nodes]:
    """The fleet of a running deployment's nodes as it was launched (its executor targets, jump hosts
    included), else of the topology's nodes (its launch settings); closed at the end."""
    from k3deploy.executors.fleet import NodeFleet
    from k3deploy.nodeplan.targets import targets_for

    targets = {j.rank: j.target for j in deployment.jobs} if deployment is not None else targets_for(topology)
    with NodeFleet(targets) as fleet:
        yield fleet
