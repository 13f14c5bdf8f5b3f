"""make_plan: a validated topology in, a frozen Plan (legality, memory, capacity) out. Pure.

A topology with roles is planned per role (planning.pd), any other one as one deployment
(planning.instance_plan); the Plan itself lives in planning.plan_model."""
from __future__ import annotations

from k3deploy.catalog.specs import Catalog
from k3deploy.planning.instance_plan import plan_instance
from k3deploy.planning.plan_model import Plan
from k3deploy.topology.loader import LoadedTopology


def make_plan(loaded: LoadedTopology, catalog: Catalog, unchecked: frozenset[str] = frozenset()) -> Plan:
    """Check legality, size memory and decide feasibility; never raises on a bad shape. Values in
    `unchecked` (dotted paths a schema error left out) block only the checks that read them."""
    if loaded.topology.roles is not None:
        from k3deploy.planning.pd import pd_plan  # only a topology with roles pays for importing it

        return pd_plan(loaded, catalog, unchecked)
    return plan_instance(loaded, catalog, unchecked)
