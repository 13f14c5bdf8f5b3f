"""The files `k3deploy render` writes for a feasible plan: one deployment, replicas behind a router, or
prefill/decode roles behind a router in PD mode (the library call behind the command)."""
from __future__ import annotations

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.exports import Format, RenderedFile, export
from k3deploy.errors import InputError
from k3deploy.planning.plan import Plan
from k3deploy.topology.replicas import router_node


def render_files(plan: Plan, fmt: Format, *, node: int | None = None, replica: int | None = None,
                 role: str | None = None, vendor: VendorSpec | None = None) -> tuple[RenderedFile, ...]:
    """Every file of `fmt`; InputError for a selection the topology does not have or a format not built."""
    if role is not None and plan.pd is None:
        raise InputError(f"--role {role}: {plan.file} has no roles")
    router = (plan.router.settings, plan.router.runs_on) if plan.router is not None else None
    python = plan.topology.router.python if plan.topology.router is not None else "python3"
    at = router_node(plan.topology)
    node_of_router = plan.topology.nodes[at] if at is not None else None  # None: where k3deploy runs
    if plan.pd is not None:
        from k3deploy.engines.pd_exports import export_pd
        from k3deploy.planning.pd import instance_inputs
        from k3deploy.topology.pd import instances

        if replica is not None:
            raise InputError(f"--replica {replica}: {plan.file} has roles, not replicas (use --role)")
        inputs = [instance_inputs(plan, inst) for inst in instances(plan.topology)]
        return export_pd(inputs, router, fmt, role=role, node=node, vendor=vendor, router_python=python,
                         name=plan.topology.name, router_node=node_of_router)
    if plan.pool is not None or plan.router is not None:
        from k3deploy.engines.replica_exports import export_replicas

        replicas = [plan.render_inputs(replica=i) for i in range(plan.topology.replicas)]
        return export_replicas(replicas, router, fmt, replica=replica, node=node, vendor=vendor,
                               router_python=python, name=plan.topology.name, router_node=node_of_router)
    if replica is not None:
        raise InputError(f"--replica {replica}: {plan.file} has no replicas")
    return export(plan.render_inputs(), fmt, node=node, vendor=vendor)
