"""Every node of a topology as a ProbeRunner: NodeFleet.run_probe over the topology's executors."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3deploy.launch.state import Deployment
    from k3deploy.topology.schema import Topology
    from k3deploy.validate.stage import ProbeRunner


@contextlib.contextmanager
def fleet_runner(topology: Topology, deployment: Deployment | None) -> Iterator[ProbeRunner]:
    """The fleet of the topology's nodes (its launch settings: ssh, ray or local), closed at the end; probes
    run on every node at once and stream their progress lines back."""
    from k3deploy.executors.fleet import NodeFleet
    from k3deploy.launch.targets import targets_for

    with NodeFleet(targets_for(topology)) as fleet:
        yield fleet.run_probe
