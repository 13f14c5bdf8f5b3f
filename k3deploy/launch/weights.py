"""`k3deploy weights status`: what each node of a unit (every instance's nodes) holds of the manifest's files at
`model.path`: present, verified by sha256 (the shards probe, on every node at once), missing, bytes still to go.
Nodes whose checkpoint directory is one shared filesystem (NFS, Lustre, ...: found by a mark one node leaves and
the others see) are hashed once, by the first of them, and synced once."""
from __future__ import annotations

import dataclasses
import json
import posixpath
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from k3deploy.checkpoint.manifest import Manifest
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.launch.prepare import Unit, held_unit
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.probes import shards as probe
from k3deploy.probes import weights_node

BASE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class NodeWeights:
    """One node's copy against the manifest (`error`: the node could not be asked; then nothing else is known)."""

    host: str
    path: str
    verified: tuple[str, ...] = ()
    wrong: tuple[str, ...] = ()  # present with a size or sha256 the manifest does not give
    missing: tuple[str, ...] = ()
    bytes_to_go: int = 0
    error: str | None = None
    ranks: tuple[str, ...] = field(default=())  # the instance ranks it serves (r0:0, prefill0:1, or 0)
    shared_with: str = ""  # host:path of the node whose copy this is (one shared filesystem), "" its own

    @property
    def complete(self) -> bool:
        """Every manifest file is there with its sha256."""
        return self.error is None and not self.wrong and not self.missing

    def as_json(self) -> dict[str, Any]:
        """The node's line of `--json`."""
        return {"host": self.host, "path": self.path, "ranks": list(self.ranks), "error": self.error,
                "present": len(self.verified) + len(self.wrong), "verified": len(self.verified),
                "wrong": list(self.wrong), "missing": list(self.missing), "bytes_to_go": self.bytes_to_go,
                "complete": self.complete, "shared_with": self.shared_with or None}


@dataclass(frozen=True)
class WeightsReport:
    """Every node's copy; exit 0 when all are complete, 3 when a node could not be asked, else 1."""

    manifest: Manifest
    nodes: tuple[NodeWeights, ...]

    @property
    def exit_code(self) -> int:
        """0 complete everywhere; 3 a node unreachable (before 1); 1 a node lacks or has a wrong file."""
        if any(n.error for n in self.nodes):
            return 3
        return 0 if all(n.complete for n in self.nodes) else 1

    def as_json(self) -> dict[str, Any]:
        """The whole report for `--json`."""
        return {"revision": self.manifest.revision, "files": len(self.manifest.files),
                "bytes": sum(d.size for d in self.manifest.files.values()),
                "bytes_to_go": sum(n.bytes_to_go for n in self.nodes if not n.shared_with),
                "exit_code": self.exit_code,
                "nodes": [n.as_json() for n in self.nodes]}


def checkpoint_nodes(unit: Unit, jobs: Sequence[NodeJob]) -> dict[tuple[str, str], list[NodeJob]]:
    """Every instance's nodes (`jobs`, as their allocation holds them) by (host, checkpoint path): one copy per
    host and path, whichever ranks share it."""
    path = unit.plan.topology.model.path
    out: dict[tuple[str, str], list[NodeJob]] = {}
    for job in jobs:
        out.setdefault((job.target.host, path), []).append(job)
    return out


def hash_copies(fleet: NodeFleet, ranks: list[int], paths: dict[int, str], manifest: Manifest) \
        -> dict[int, NodeWeights | str]:
    """Hash the given nodes' copies at once (the shards probe, against the manifest): each node's files sorted
    against the manifest (`Manifest.sort_copy`), or why it could not be asked."""
    spec = {"expect": {}, "hash": True, "files": manifest.expected(), "progress_s": 5.0}
    total = sum(d.size for d in manifest.files.values())
    out = fleet.run_probe(probe, timeout_s=BASE_TIMEOUT_S + total / probe.MIN_HASH_BYTES_PER_S, ranks=ranks,
                          args_for=lambda r: [json.dumps({**spec, "path": paths[r]})])
    copies: dict[int, NodeWeights | str] = {}
    for r, o in out.items():
        if not o.ok:
            copies[r] = str(o.error)
        elif not isinstance(o.value, dict) or o.value.get("type") != "result":
            copies[r] = NodeWeights(fleet.host(r), paths[r],
                                    error=f"the checkpoint probe gave no result ({str(o.value)[:200]})")
        else:
            copies[r] = NodeWeights(fleet.host(r), paths[r], *manifest.sort_copy(
                {n: (int(d[0]), str(d[1])) for n, d in o.value.get("files", {}).items()}))
    return copies


@dataclass(frozen=True)
class SharedStorage:
    """Which nodes' checkpoint directories are one filesystem: each rank's owner (the first rank of its group,
    itself when alone) and the filesystem type each rank's directory is on."""

    owner: dict[int, int]
    fs: dict[int, str]

    @property
    def owners(self) -> list[int]:
        """The ranks whose copies are their own (one per storage)."""
        return sorted(set(self.owner.values()))


def shared_storage(fleet: NodeFleet, ranks: list[int], paths: dict[int, str]) -> SharedStorage:
    """Every node leaves a mark in its checkpoint directory (or the deepest one above it that exists: nothing is
    made), then lists the marks it sees there: nodes that see each other's marks, and whose paths go on alike below
    where they left them, share storage (two directories still to make under one parent are two). A node that
    cannot leave one (read-only, unreachable) is its own."""
    run = uuid.uuid4().hex[:12]
    name = {r: f".k3deploy-shared-{run}-{r}" for r in ranks}

    def ask(op: str, extra: Any) -> dict[int, Any]:
        out = fleet.run_probe(weights_node, ranks=ranks, timeout_s=BASE_TIMEOUT_S,
                              args_for=lambda r: [json.dumps({"op": op, "path": paths[r], **extra(r)})])
        return {r: (o.value if o.ok and isinstance(o.value, dict) else {}) for r, o in out.items()}

    marked = ask("mark", lambda r: {"name": name[r]})
    try:
        seen = ask("marks", lambda r: {"prefix": f".k3deploy-shared-{run}-"})
    finally:
        ask("unmark", lambda r: {"name": name[r], "at": marked[r].get("at", paths[r])})
    below = {r: posixpath.relpath(posixpath.abspath(paths[r]), marked[r].get("at", paths[r])) for r in ranks}
    by_name = {n: r for r, n in name.items() if marked[r].get("ok")}
    owner = {r: r for r in ranks}
    for r in sorted(ranks):
        if not marked[r].get("ok"):
            continue
        for n in seen[r].get("names", ()):  # r sees s's mark: one storage; the lower rank owns it
            s = by_name.get(n)
            if s is not None and s != r and below[s] == below[r]:
                a, b = _root(owner, r), _root(owner, s)
                owner[max(a, b)] = min(a, b)
    return SharedStorage(owner={r: _root(owner, r) for r in ranks},
                         fs={r: str(marked[r].get("fs", "unknown")) for r in ranks})


def _root(owner: dict[int, int], r: int) -> int:
    while owner[r] != r:
        r = owner[r]
    return r


def weights_status(unit: Unit, manifest: Manifest, factory: ExecutorFactory = open_executor) -> WeightsReport:
    """Hash every node's copy at once (once per shared filesystem; the nodes as their allocation holds them) and
    sort its files against the manifest."""
    with held_unit(unit) as jobs:
        return _status(checkpoint_nodes(unit, jobs), manifest, factory)


def _status(nodes: dict[tuple[str, str], list[NodeJob]], manifest: Manifest, factory: ExecutorFactory) \
        -> WeightsReport:
    keys = list(nodes)
    paths = {i: k[1] for i, k in enumerate(keys)}
    with NodeFleet({i: nodes[k][0].target for i, k in enumerate(keys)}, factory) as fleet:
        shared = shared_storage(fleet, list(paths), paths)
        copies = hash_copies(fleet, shared.owners, paths, manifest)
    out = []
    for i, (host, path) in enumerate(keys):
        ranks = tuple(str(j.rank) for j in nodes[(host, path)])
        owner = shared.owner[i]
        c = copies[owner]
        with_ = "" if owner == i else f"{keys[owner][0]}:{keys[owner][1]} ({shared.fs[i]})"
        out.append(NodeWeights(host, path, error=c, ranks=ranks, shared_with=with_) if isinstance(c, str)
                   else dataclasses.replace(c, host=host, path=path, ranks=ranks, shared_with=with_))
    return WeightsReport(manifest, tuple(out))
