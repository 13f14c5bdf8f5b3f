"""Prefill/decode roles: which nodes and ports each instance gets, the topology of one instance, and the
checks that tie `roles`, `nodes`, `router` and the ports together (every problem a located issue, exit 2)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from k3deploy.diagnostics import Issue
from k3deploy.topology.claims import claim, first_ranked, matches, unclaimed
from k3deploy.topology.roles import RoleGroup
from k3deploy.topology.schema import Topology

ROLE_NAMES = ("prefill", "decode")
PD_CODES = frozenset({"PD_REPLICAS", "PD_ROUTER", "PD_NODES", "PD_NODE_COUNT", "PD_RANK", "PD_BACKEND",
                      "PD_ENGINE", "PD_PORTS"})
# What each engine's disaggregation can move the cache with (SGLang --disaggregation-transfer-backend choices
# K3 can use; vLLM's NixlConnector). The first is the default.
BACKENDS = {"sglang": ("mooncake", "nixl", "ascend"), "vllm": ("nixl",)}


@dataclass(frozen=True)
class Instance:
    """One prefill or decode instance: its role, index in the role, index over all instances, and nodes."""

    role: str
    index: int
    number: int  # prefill 0..P-1, then decode P..P+D-1: the offset of its engine and rendezvous ports
    nodes: tuple[int, ...]


def _err(code: str, message: str, path: str, hint: str | None = None) -> Issue:
    return Issue(code=code, severity="error", message=message, path=path, hint=hint)


def pd_family(t: Topology) -> str:
    """Whose disaggregation the engine follows: sglang, vllm, or vllm-ascend (the stand-in: its mimic)."""
    return getattr(t.engine, "mimic", "sglang") if t.engine.kind == "sim" else t.engine.kind


def role_group(t: Topology, role: str) -> RoleGroup:
    """The roles section's group named `role`."""
    assert t.roles is not None
    return t.roles.prefill if role == "prefill" else t.roles.decode


def instances(t: Topology) -> tuple[Instance, ...]:
    """Every instance, prefill first (the topology's checks passed)."""
    out: list[Instance] = []
    for role in ROLE_NAMES:
        g = role_group(t, role)
        per = len(g.nodes) // g.instances
        for i in range(g.instances):
            names = g.nodes[i * per:(i + 1) * per]
            out.append(Instance(role, i, len(out), tuple(matches(t, n)[0] for n in names)))
    return tuple(out)


def side_channel_stride(t: Topology) -> int:
    """Ports each instance's NIXL side channel takes (vLLM listens on the base + each rank's DP index)."""
    assert t.roles is not None
    return max(t.roles.prefill.parallel.dp, t.roles.decode.parallel.dp)


def bootstrap_port(t: Topology, inst: Instance) -> int | None:
    """The SGLang bootstrap port of a prefill instance (None: decode, or an engine without one)."""
    assert t.roles is not None
    return t.roles.transfer.bootstrap_port + inst.index if inst.role == "prefill" and pd_family(t) == "sglang" \
        else None


def side_channel_port(t: Topology, inst: Instance) -> int | None:
    """The vLLM NIXL side-channel base port of an instance (None for SGLang)."""
    assert t.roles is not None
    return t.roles.transfer.side_channel_port + inst.number * side_channel_stride(t) if pd_family(t) == "vllm" \
        else None


def instance_topology(t: Topology, inst: Instance) -> Topology:
    """One instance as a deployment of its own: its nodes, its role's parallel shape, its ports, no router."""
    return t.model_copy(update={
        "name": f"{t.name}-{inst.role}{inst.index}", "nodes": [t.nodes[i] for i in inst.nodes], "roles": None,
        "router": None, "parallel": role_group(t, inst.role).parallel,
        "engine": t.engine.model_copy(update={"port": t.engine.port + inst.number}),
        "launch": t.launch.model_copy(update={"port": t.launch.port + inst.number})})


def _node_issues(t: Topology) -> Iterator[Issue]:
    assert t.roles is not None
    seen: dict[int, str] = {}
    for role in ROLE_NAMES:
        g = role_group(t, role)
        if len(g.nodes) % g.instances:
            yield _err("PD_NODE_COUNT", f"{len(g.nodes)} {role} nodes cannot be cut into {g.instances} equal "
                       "instances", f"roles.{role}.nodes", f"list {g.instances} x N nodes, or change instances")
        yield from claim(t, g.nodes, f"roles.{role}.nodes", seen, "PD_NODES", " (an instance owns its nodes)")
    missing = unclaimed(t, seen)
    if missing:
        yield _err("PD_NODES", f"node(s) {', '.join(missing)} in no role", "roles",
                   "add them to roles.prefill.nodes or roles.decode.nodes, or remove them from nodes")


def _port_issues(t: Topology) -> Iterator[Issue]:
    assert t.roles is not None
    tr, n = t.roles.transfer, t.roles.prefill.instances + t.roles.decode.instances
    ranges = [("engine.port + k", "engine.port", range(t.engine.port, t.engine.port + n)),
              ("launch.port + k", "launch.port", range(t.launch.port, t.launch.port + n))]
    family = pd_family(t)
    if family == "sglang":
        ranges.append(("bootstrap_port + i", "roles.transfer.bootstrap_port",
                       range(tr.bootstrap_port, tr.bootstrap_port + t.roles.prefill.instances)))
    if family == "vllm":
        ranges.append(("side_channel_port + k x DP", "roles.transfer.side_channel_port",
                       range(tr.side_channel_port, tr.side_channel_port + n * side_channel_stride(t))))
    if t.router is not None:
        ranges.append(("router.port", "router.port", range(t.router.port, t.router.port + 1)))
        m = t.router.metrics_port_or_default
        ranges.append(("the router's metrics port", t.router.metrics_path, range(m, m + 1)))
    for what, path, r in ranges:
        if r[-1] > 65535:
            yield _err("PD_PORTS", f"{what} runs to {r[-1]}, past 65535", path, "lower it")
    # Instances share no node, but a local rig (and the router on a node) puts them on one machine: keep
    # every port range apart, so one rule holds everywhere.
    for a in range(len(ranges)):
        for b in range(a + 1, len(ranges)):
            (wa, _, ra), (wb, pb, rb) = ranges[a], ranges[b]
            if max(ra.start, rb.start) < min(ra.stop, rb.stop):  # step-1 ranges: no set of a fuzzed huge one
                yield _err("PD_PORTS", f"{wb} ({rb.start}-{rb[-1]}) overlaps {wa} ({ra.start}-{ra[-1]})", pb,
                           "move it apart by at least the instance count")


def pd_issues(t: Topology) -> list[Issue]:
    """Every inconsistency between roles, their nodes, the transfer, the router and the ports."""
    if t.roles is None:
        return []
    out: list[Issue] = []
    if t.replicas > 1 or t.replica_nodes is not None:
        out.append(_err("PD_REPLICAS", "roles and replicas are two ways to lay out nodes; use one",
                        "replicas" if t.replicas > 1 else "replica_nodes",
                        "remove replicas/replica_nodes (set roles.prefill.instances and roles.decode.instances)"))
    if t.router is None:
        out.append(_err("PD_ROUTER", "prefill/decode roles need a router in PD mode (it hands each request to a "
                        "prefill and a decode instance)", "roles", "add `router: {kind: ...}`"))
    if (i := first_ranked(t)) is not None:
        out.append(_err("PD_RANK", "with roles, a node's rank is its place in its instance's node list",
                        f"nodes[{i}].rank", "remove `rank` (order the nodes in roles.prefill/decode.nodes)"))
    family = pd_family(t)
    backend = t.roles.transfer.backend
    if family not in BACKENDS:
        out.append(_err("PD_ENGINE", f"prefill/decode roles are not built for {t.engine.kind}", "roles",
                        f"use engine kind {' or '.join(BACKENDS)}, or remove roles"))
    elif backend is not None and backend not in BACKENDS[family]:
        out.append(_err("PD_BACKEND", f"{family} cannot move the cache with {backend}", "roles.transfer.backend",
                        f"use {' or '.join(BACKENDS[family])}"))
    out += _node_issues(t)
    out += _port_issues(t)
    return out
