"""A unit of deployment's instances: a single deployment is its own one instance; a service behind a router is
its replicas, or its prefill and decode instances, each a deployment of its own (its topology and records)."""
from __future__ import annotations

from dataclasses import dataclass

from k3deploy.topology.schema import Topology


@dataclass(frozen=True)
class UnitInstance:
    """One instance of a unit: how it is named beside the unit, its role, and its own topology."""

    label: str  # r0, prefill0, decode1: the suffix of what is said of it; "" for a deployment's one instance
    role: str  # prefill | decode; "" for a replica or a single deployment
    topology: Topology  # its own (named NAME-r0, NAME-prefill0: its deployment record); the unit's when alone


def behind_router(t: Topology) -> bool:
    """Whether the unit is a service (replicas or prefill/decode roles) behind a router, not one deployment."""
    return t.roles is not None or t.replicas > 1 or t.router is not None


def unit_instances(t: Topology) -> tuple[UnitInstance, ...]:
    """The unit's instances in launch order (prefills first); a deployment with no router is its one instance."""
    if t.roles is not None:
        from k3deploy.topology.pd import instance_topology, instances

        return tuple(UnitInstance(f"{i.role}{i.index}", i.role, instance_topology(t, i)) for i in instances(t))
    if not behind_router(t):
        return (UnitInstance("", "", t),)
    from k3deploy.topology.replicas import replica_topology

    return tuple(UnitInstance(f"r{i}", "", replica_topology(t, i)) for i in range(t.replicas))
