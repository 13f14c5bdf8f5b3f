"""Which nodes a list of names claims (replica_nodes, roles.<role>.nodes, router.runs_on): each name is the
host or ip of exactly one node, and a node belongs to one group at most."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from k3deploy.diagnostics import Issue
from k3deploy.topology.schema import Topology


def matches(t: Topology, name: str) -> list[int]:
    """Indices of the nodes a name names (by host or by ip)."""
    return [i for i, n in enumerate(t.nodes) if name in (n.host, n.ip)]


def claim(t: Topology, names: Sequence[str], path: str, seen: dict[int, str], code: str,
          owned: str = "") -> Iterator[Issue]:
    """The issues of one group's names (at `path[j]`): a name of no node, of several, or of a node another
    group claimed (`owned` says why that is wrong); every node it claims is added to `seen` (index -> path)."""
    for j, name in enumerate(names):
        found, where = matches(t, name), f"{path}[{j}]"
        if not found:
            yield Issue(code=code, severity="error", message=f"{name!r} is the host or ip of no node", path=where,
                        hint=f"known: {', '.join(sorted({n.host for n in t.nodes}))}")
        elif len(found) > 1:
            yield Issue(code=code, severity="error", message=f"{name!r} names {len(found)} nodes", path=where,
                        hint="name the node by its ip")
        elif found[0] in seen:
            yield Issue(code=code, severity="error", path=where,
                        message=f"node {name!r} is in {seen[found[0]]} already{owned}")
        else:
            seen[found[0]] = where


def unclaimed(t: Topology, seen: dict[int, str]) -> list[str]:
    """The ips of the nodes no group claimed."""
    return [t.nodes[i].ip for i in range(len(t.nodes)) if i not in seen]


def first_ranked(t: Topology) -> int | None:
    """The index of the first node that sets `rank` (which a layout by groups leaves to the group's order)."""
    return next((i for i, n in enumerate(t.nodes) if n.rank is not None), None)
