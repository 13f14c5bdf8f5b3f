"""Replicas: which nodes each copy of the shape runs on, the topology of one replica, and the checks that
tie `replicas`, `replica_nodes`, `router` and the ports together (every problem a located issue)."""
from __future__ import annotations

from collections.abc import Iterator

from k3deploy.diagnostics import Issue
from k3deploy.topology.claims import claim, first_ranked, matches, unclaimed
from k3deploy.topology.router import routers_for
from k3deploy.topology.schema import Topology

# The codes below are mistakes in the file itself (exit 2).
REPLICA_CODES = frozenset({"REPLICA_NODE_COUNT", "REPLICA_NODES", "REPLICA_RANK", "REPLICA_PORTS",
                           "ROUTER_ENGINE", "ROUTER_NODE", "ROUTER_PORT"})


def _err(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="error", message=message, path=path, hint=hint)


def replica_groups(t: Topology) -> list[list[int]]:
    """Node indices of each replica, rank order (the topology's checks passed)."""
    if t.replica_nodes is not None:
        return [[matches(t, name)[0] for name in group] for group in t.replica_nodes]
    per = len(t.nodes) // t.replicas
    order = [i for i, _ in sorted(enumerate(t.nodes), key=lambda iv: iv[1].rank if iv[1].rank is not None
                                  else iv[0])]
    return [order[r * per:(r + 1) * per] for r in range(t.replicas)]


def replica_topology(t: Topology, replica: int) -> Topology:
    """One replica as a deployment of its own: its nodes, its ports (engine.port + i, launch.port + i), no
    router; a single-replica topology is returned as it is."""
    if t.replicas == 1:
        return t
    nodes = [t.nodes[i] for i in replica_groups(t)[replica]]
    return t.model_copy(update={
        "name": f"{t.name}-r{replica}", "nodes": nodes, "replicas": 1, "replica_nodes": None, "router": None,
        "engine": t.engine.model_copy(update={"port": t.engine.port + replica}),
        "launch": t.launch.model_copy(update={"port": t.launch.port + replica})})


def router_node(t: Topology) -> int | None:
    """Index of the node the router runs on (None: on the host running k3deploy)."""
    if t.router is None or t.router.runs_on == "local":
        return None
    found = matches(t, t.router.runs_on)
    return found[0] if found else None


def _group_issues(t: Topology) -> Iterator[Issue]:
    groups = t.replica_nodes
    if groups is None:
        if len(t.nodes) % t.replicas:
            yield _err("REPLICA_NODE_COUNT", f"{len(t.nodes)} nodes cannot be cut into {t.replicas} equal replicas",
                       "replicas", f"list {t.replicas} x N nodes, or name each replica's nodes in replica_nodes")
        return
    if len(groups) != t.replicas:
        yield _err("REPLICA_NODES", f"{len(groups)} node groups for {t.replicas} replicas", "replica_nodes",
                   "give one list of hosts per replica")
    if len({len(g) for g in groups}) > 1:
        yield _err("REPLICA_NODES", f"replicas of one shape need the same node count; groups have "
                   f"{[len(g) for g in groups]}", "replica_nodes")
    seen: dict[int, str] = {}
    for r, group in enumerate(groups):
        yield from claim(t, group, f"replica_nodes[{r}]", seen, "REPLICA_NODES")
    missing = unclaimed(t, seen)
    if missing:
        yield _err("REPLICA_NODES", f"node(s) {', '.join(missing)} in no replica", "replica_nodes",
                   "add them to a group or remove them from nodes")


def _port_issues(t: Topology) -> Iterator[Issue]:
    n = t.replicas
    engine = range(t.engine.port, t.engine.port + n)
    rendezvous = range(t.launch.port, t.launch.port + n)
    if n > 1 and (engine[-1] > 65535 or rendezvous[-1] > 65535):
        yield _err("REPLICA_PORTS", f"{n} replicas need ports up to {max(engine[-1], rendezvous[-1])}, past 65535",
                   "replicas", "lower engine.port or launch.port")
    elif n > 1 and set(engine) & set(rendezvous):
        yield _err("REPLICA_PORTS", f"replicas serve on {engine.start}-{engine[-1]} (engine.port + i) and "
                   f"rendezvous on {rendezvous.start}-{rendezvous[-1]} (launch.port + i): they overlap",
                   "replicas", "move engine.port or launch.port apart by at least the replica count")
    r = t.router
    if r is None:
        return
    metrics = r.metrics_port_or_default
    if metrics > 65535:
        yield _err("ROUTER_PORT", f"router metrics port {metrics} (port + 1) is past 65535", r.metrics_path,
                   "set router.metrics_port to a free port")
    if r.metrics_port == r.port:
        yield _err("ROUTER_PORT", f"router metrics_port {r.port} is the router's own port", "router.metrics_port",
                   "pick another port (default: port + 1)")
    # The router shares a machine with the replicas on a node, or on this host when the nodes are local.
    if r.runs_on != "local" or t.launch.nodes_are_here:
        for what, ports in (("engine.port + i", engine), ("launch.port + i", rendezvous)):
            if r.port in ports:
                yield _err("ROUTER_PORT", f"router port {r.port} is a replica's port ({what}: "
                           f"{ports.start}-{ports[-1]}) on the same machine", "router.port", "pick another port")
            if metrics in ports:
                yield _err("ROUTER_PORT", f"router metrics port {metrics} is a replica's port ({what}: "
                           f"{ports.start}-{ports[-1]}) on the same machine", r.metrics_path,
                           "set router.metrics_port to a free port")


def replica_issues(t: Topology) -> list[Issue]:
    """Every inconsistency between replicas, their nodes, the router and the ports (paths, not positions)."""
    out = list(_group_issues(t))
    if t.replicas > 1 and (i := first_ranked(t)) is not None:
        out.append(_err("REPLICA_RANK", "with replicas, a node's rank is its place in its replica's node list",
                        f"nodes[{i}].rank", "remove `rank` (order each replica's nodes in replica_nodes)"))
    out += _port_issues(t)
    r = t.router
    if r is not None:
        kinds = routers_for(t.engine.kind, getattr(t.engine, "mimic", None))
        if r.kind not in kinds:
            what = f"the stand-in mimicking {getattr(t.engine, 'mimic', 'sglang')}" if t.engine.kind == "sim" \
                else t.engine.kind
            out.append(_err("ROUTER_ENGINE", f"router {r.kind} cannot front {what} replicas", "router.kind",
                            f"use {' or '.join(kinds)}"))
        if r.runs_on != "local":
            found = matches(t, r.runs_on)
            if len(found) != 1:
                out.append(_err("ROUTER_NODE", f"runs_on {r.runs_on!r} names {len(found) or 'no'} node"
                                f"{'s' if len(found) > 1 else ''}", "router.runs_on",
                                "`local`, or the host or ip of exactly one node"))
    return out
