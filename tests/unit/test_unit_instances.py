"""A unit of deployment's instances: a deployment alone is its one instance; replicas and roles each their own."""
from __future__ import annotations

from pathlib import Path

from k3deploy.records.locate import load_topology_file
from k3deploy.topology.units import behind_router, unit_instances

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def test_a_deployment_alone_is_its_own_one_instance() -> None:
    t = load_topology_file(TOPOLOGIES / "h100-4x8-sglang.yaml")
    assert not behind_router(t)
    (only,) = unit_instances(t)
    assert (only.label, only.role, only.topology) == ("", "", t)


def test_replicas_are_each_a_deployment_of_their_own_in_launch_order() -> None:
    t = load_topology_file(TOPOLOGIES / "replicas-h200-2x2x8-smg.yaml")
    assert behind_router(t)
    got = unit_instances(t)
    assert [(u.label, u.role, u.topology.name) for u in got] == [("r0", "", f"{t.name}-r0"), ("r1", "", f"{t.name}-r1")]
    assert all(u.topology.router is None and u.topology.replicas == 1 for u in got)


def test_roles_are_each_instance_prefills_first() -> None:
    t = load_topology_file(TOPOLOGIES / "pd-h200-1p1d-sglang.yaml")
    assert behind_router(t)
    got = unit_instances(t)
    assert [(u.label, u.role) for u in got] == [("prefill0", "prefill"), ("decode0", "decode")]
    assert [u.topology.name for u in got] == [f"{t.name}-prefill0", f"{t.name}-decode0"]
