"""`k3deploy weights status`: what each node of a unit (every instance's nodes) holds of the manifest's files at
`model.path`: present, verified by sha256 (the shards probe, on every node at once), missing, bytes still to go."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3deploy.checkpoint.manifest import Manifest, topology_manifest
from k3deploy.errors import InputError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.launch.prepare import Prepared
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.probes import shards as probe

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

    @property
    def complete(self) -> bool:
        """Every manifest file is there with its sha256."""
        return self.error is None and not self.wrong and not self.missing

    def as_json(self) -> dict[str, Any]:
        """The node's line of `--json`."""
        return {"host": self.host, "path": self.path, "ranks": list(self.ranks), "error": self.error,
                "present": len(self.verified) + len(self.wrong), "verified": len(self.verified),
                "wrong": list(self.wrong), "missing": list(self.missing), "bytes_to_go": self.bytes_to_go,
                "complete": self.complete}


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
                "bytes_to_go": sum(n.bytes_to_go for n in self.nodes), "exit_code": self.exit_code,
                "nodes": [n.as_json() for n in self.nodes]}


def load_manifest(prep: Prepared, manifest: Path | None) -> Manifest:
    """`--manifest`, else the topology's `validate.manifest` (relative to the topology file, as the shards stage
    reads it); InputError naming the fix when there is none."""
    found = topology_manifest(prep.plan.topology.validate_.manifest, prep.plan.file, manifest)
    if found is None:
        raise InputError(f"{prep.plan.file}: no checkpoint manifest to sync or check against",
                         hint="pass --manifest FILE, or set validate.manifest (make one with `k3deploy manifest "
                         "create DIR` or `k3deploy manifest from-hub REPO --revision SHA`)")
    return found


def checkpoint_nodes(prep: Prepared) -> dict[tuple[str, str], list[NodeJob]]:
    """Every instance's nodes by (host, checkpoint path): one copy per host and path, whichever ranks share it."""
    path = prep.plan.topology.model.path
    out: dict[tuple[str, str], list[NodeJob]] = {}
    for job in prep.jobs:
        out.setdefault((job.target.host, path), []).append(job)
    return out


def judge_copy(host: str, path: str, answer: Any, manifest: Manifest, ranks: tuple[str, ...]) -> NodeWeights:
    """Sort the shards probe's answer for one node against the manifest."""
    if not isinstance(answer, dict) or answer.get("type") != "result":
        return NodeWeights(host, path, error=f"the checkpoint probe gave no result ({str(answer)[:200]})",
                           ranks=ranks)
    got = {n: (int(d[0]), str(d[1])) for n, d in answer.get("files", {}).items()}
    verified: list[str] = []
    wrong: list[str] = []
    missing: list[str] = []
    for name, want in sorted(manifest.files.items()):
        have = got.get(name)
        (missing if have is None else verified if have == (want.size, want.sha256) else wrong).append(name)
    to_go = sum(manifest.files[n].size for n in (*wrong, *missing))
    return NodeWeights(host, path, tuple(verified), tuple(wrong), tuple(missing), to_go, ranks=ranks)


def hash_copies(fleet: NodeFleet, ranks: list[int], paths: dict[int, str], manifest: Manifest) \
        -> dict[int, NodeWeights | str]:
    """Hash the given nodes' copies at once (the shards probe, against the manifest): each node's sorted files,
    or why it could not be asked."""
    spec = {"expect": {}, "hash": True, "files": manifest.expected(), "progress_s": 5.0}
    total = sum(d.size for d in manifest.files.values())
    out = fleet.run_probe(probe, timeout_s=BASE_TIMEOUT_S + total / probe.MIN_HASH_BYTES_PER_S, ranks=ranks,
                          args_for=lambda r: [json.dumps({**spec, "path": paths[r]})])
    return {r: judge_copy(fleet.host(r), paths[r], o.value, manifest, ()) if o.ok else str(o.error)
            for r, o in out.items()}


def weights_status(prep: Prepared, manifest: Manifest, factory: ExecutorFactory = open_executor) -> WeightsReport:
    """Hash every node's copy at once and sort its files against the manifest."""
    nodes = checkpoint_nodes(prep)
    keys = list(nodes)
    with NodeFleet({i: nodes[k][0].target for i, k in enumerate(keys)}, factory) as fleet:
        copies = hash_copies(fleet, list(range(len(keys))), {i: k[1] for i, k in enumerate(keys)}, manifest)
    out = []
    for i, (host, path) in enumerate(keys):
        ranks = tuple(str(j.rank) for j in nodes[(host, path)])
        c = copies[i]
        out.append(NodeWeights(host, path, error=c, ranks=ranks) if isinstance(c, str)
                   else dataclasses.replace(c, ranks=ranks))
    return WeightsReport(manifest, tuple(out))
