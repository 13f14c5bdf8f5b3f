"""A unit of deployment's instances: a deployment alone is its one instance; replicas and roles each their own."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.records.locate import load_topology_file
from k3deploy.topology.loader import TopologyError, load_topology, parse_topology
from k3deploy.topology.units import UnitLayout, behind_router, unit_instances

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


def test_the_loader_lays_out_the_unit_once() -> None:
    """The instances, the router's node and the roles' transfer family come with the loaded topology."""
    pd = load_topology(TOPOLOGIES / "pd-h200-1p1d-sglang.yaml")
    assert pd.layout == UnitLayout(unit_instances(pd.topology), 2, "sglang")  # the router runs on decode-0
    replicas = load_topology(TOPOLOGIES / "replicas-h200-2x2x8-smg.yaml")
    assert replicas.layout == UnitLayout(unit_instances(replicas.topology), 0, None)


def test_a_partial_topology_is_laid_out_too() -> None:
    """A schema error elsewhere leaves a partial whose replicas still fit its nodes: it is planned, so laid out."""
    text = (TOPOLOGIES / "replicas-h200-2x2x8-smg.yaml").read_text(encoding="utf-8")
    with pytest.raises(TopologyError) as exc:
        parse_topology(text.replace("context_length: 131072", "context_length: -1"), "replicas.yaml")
    partial = exc.value.partial
    assert partial is not None and [u.label for u in partial.layout.instances] == ["r0", "r1"]
