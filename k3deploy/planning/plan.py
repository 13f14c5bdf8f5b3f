"""make_plan: a validated topology in, a frozen Plan (legality, memory, capacity) out. Pure.

The unit's layout, worked out as its topology was loaded (each instance's own topology, the router's node), and
what the engines say of it (the router's worker URLs, the engine's family, the parallel shapes) are gathered once,
here, and handed down as UnitFacts; a topology with roles is then planned per role (planning.pd), any other one
as one deployment (planning.instance_plan); the Plan itself lives in planning.plan_model."""
from __future__ import annotations

from k3deploy.catalog.specs import Catalog
from k3deploy.engines.context import host_port
from k3deploy.engines.kinds import engine_family, engine_flavour
from k3deploy.engines.router import PD_FLAG, router_table
from k3deploy.engines.shape import Shape, make_shape
from k3deploy.planning.instance_plan import blocked_groups, plan_instance
from k3deploy.planning.plan_model import Plan, UnitFacts
from k3deploy.topology.loader import LoadedTopology


def make_plan(loaded: LoadedTopology, catalog: Catalog, unchecked: frozenset[str] = frozenset()) -> Plan:
    """Check legality, size memory and decide feasibility; never raises on a bad shape. Values in
    `unchecked` (dotted paths a schema error left out) block only the checks that read them."""
    facts = unit_facts(loaded, catalog, shaped="legality" not in blocked_groups(unchecked))
    if loaded.topology.roles is not None:
        from k3deploy.planning.pd import pd_plan  # only a topology with roles pays for importing it

        return pd_plan(loaded, catalog, unchecked, facts)
    return plan_instance(loaded, catalog, unchecked, facts, facts.layout.instances[0])


def unit_facts(loaded: LoadedTopology, catalog: Catalog, shaped: bool) -> UnitFacts:
    """Each instance of the unit (its layout, worked out as it was loaded) and what the engines make of it, once;
    `shaped`: whether the parallel values were read (a schema error can leave them out), so each role's shape
    can be made (for a model the catalog knows)."""
    t, layout = loaded.topology, loaded.layout
    hw = catalog.hardware.get(t.hardware.gpu)
    model = catalog.models.get(t.model.id)
    family = engine_family(t.engine.kind, getattr(t.engine, "mimic", None))
    table = router_table(t.router.kind) if t.router is not None else None
    shapes: dict[str, Shape] = {}
    for inst in layout.instances:
        p = inst.topology.parallel
        if shaped and model is not None and inst.role not in shapes:  # a role's instances share one shape
            shapes[inst.role] = make_shape(family, tp=p.tp, ep=p.ep, dp=p.dp, pp=p.pp, dcp=p.dcp,
                                           attention_dp=p.attention_dp, nnodes=len(inst.topology.nodes),
                                           gpus_per_node=t.hardware.gpus_per_node,
                                           num_experts=model.architecture.num_experts)
    return UnitFacts(
        layout=layout, family=family,
        flavour=engine_flavour(t.engine, hw.vendor) if hw is not None else None,
        router_policies=(table.choices("--policy") or ()) if table is not None else (),
        router_pd=t.router is not None and table is not None and PD_FLAG[t.router.kind] in table.by_flag,
        worker_urls=tuple(f"http://{host_port(t.nodes[i.nodes[0]].ip, i.topology.engine.port)}"
                          for i in layout.instances) if t.router is not None else (),
        shapes=shapes)
