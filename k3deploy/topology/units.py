"""A unit of deployment's instances: a single deployment is its own one instance; a service behind a router is
its replicas, or its prefill and decode instances, each a deployment of its own (its topology and records).
The unit's layout (its instances, the router's node, whose PD transfer its roles follow) is worked out once,
as its topology is loaded."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from k3deploy.topology.schema import Topology


@dataclass(frozen=True)
class UnitInstance:
    """One instance of a unit: how it is named beside the unit, its role, its own topology, and where it sits in
    the unit (its nodes, the offset of its ports, its transfer ports), worked out once for every later stage."""

    label: str  # r0, prefill0, decode1: the suffix of what is said of it; "" for a deployment's one instance
    role: str  # prefill | decode; "" for a replica or a single deployment
    topology: Topology  # its own (named NAME-r0, NAME-prefill0: its deployment record); the unit's when alone
    number: int = 0  # its place over all the unit's instances: the offset of its engine and rendezvous ports
    nodes: tuple[int, ...] = ()  # its nodes' indices in the unit's node list, rank order
    bootstrap_port: int | None = None  # a prefill's SGLang bootstrap port (None: decode, replicas, vLLM)
    side_channel_port: int | None = None  # a PD instance's vLLM NIXL side-channel base port (None: SGLang)


def behind_router(t: Topology) -> bool:
    """Whether the unit is a service (replicas or prefill/decode roles) behind a router, not one deployment."""
    return t.roles is not None or t.replicas > 1 or t.router is not None


def unit_instances(t: Topology) -> tuple[UnitInstance, ...]:
    """The unit's instances in launch order (prefills first); a deployment with no router is its one instance."""
    if t.roles is not None:
        from k3deploy.topology.pd import bootstrap_port, instance_topology, instances, side_channel_port

        return tuple(UnitInstance(f"{i.role}{i.index}", i.role, instance_topology(t, i), i.number, i.nodes,
                                  bootstrap_port(t, i), side_channel_port(t, i)) for i in instances(t))
    if not behind_router(t):
        ranked = sorted(enumerate(t.nodes), key=lambda iv: iv[1].rank if iv[1].rank is not None else iv[0])
        return (UnitInstance("", "", t, 0, tuple(i for i, _ in ranked)),)
    from k3deploy.topology.replicas import replica_groups, replica_topology

    groups = replica_groups(t)
    return tuple(UnitInstance(f"r{i}", "", replica_topology(t, i), i, tuple(groups[i])) for i in range(t.replicas))


class UnitLayout(NamedTuple):
    """How a unit is laid out over its nodes, worked out once from its topology for every later stage."""

    instances: tuple[UnitInstance, ...]  # in launch order (prefills first)
    router_node: int | None  # the node router.runs_on names (None: local, or no router)
    pd_family: str | None  # with roles: whose disaggregation the engine follows (None: no roles)


def unit_layout(t: Topology) -> UnitLayout:
    """The layout of the unit `t` describes (a topology whose replicas and roles fit its nodes and ports)."""
    from k3deploy.topology.replicas import router_node

    pd_family = None
    if t.roles is not None:
        from k3deploy.topology.pd import pd_family as transfer_family

        pd_family = transfer_family(t)
    return UnitLayout(unit_instances(t), router_node(t), pd_family)
