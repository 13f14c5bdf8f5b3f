"""Digests of every node against the manifest, and against each other: who differs, in which files."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from k3deploy.checkpoint.manifest import Manifest
from k3deploy.probes.shard_names import label, listed

Digest = tuple[int, str]
MAX_FILE_LINES = 3  # up to this many differing files get a line each; more become one summary line


@dataclass(frozen=True)
class NodeDigests:
    """What one node's probe hashed, and the revision its copy claims."""

    rank: int
    files: Mapping[str, Digest]
    revision: str | None = None
    known_bad: frozenset[str] = field(default_factory=frozenset)  # already failed the structural check


def _short(sha: str) -> str:
    return sha[:12]


def _lines(differ: list[str], per_file: Mapping[str, str], summary: str) -> list[str]:
    if len(differ) <= MAX_FILE_LINES:
        return [f"{label(n)}: {per_file[n]}" for n in differ]
    return [f"{summary}: {listed([label(n) for n in differ])}"]


def against_manifest(node: NodeDigests, manifest: Manifest) -> list[str]:
    """This node's files that are missing or differ from the manifest."""
    per_file: dict[str, str] = {}
    for name, want in sorted(manifest.files.items()):
        if name in node.known_bad:
            continue
        got = node.files.get(name)
        if got is None:
            per_file[name] = "missing (listed in the manifest)"
        elif got[0] != want.size:
            per_file[name] = f"{got[0]:,} bytes, the manifest says {want.size:,}"
        elif got[1] != want.sha256:
            per_file[name] = f"sha256 {_short(got[1])}… differs from the manifest's {_short(want.sha256)}…"
    if not per_file:
        return []
    differ = sorted(per_file)
    revision = ""
    if node.revision and manifest.revision and node.revision != manifest.revision:
        revision = f"revision {node.revision}, the manifest's is {manifest.revision}; "
    if revision:
        return [f"{revision}{_count(differ)}: {listed([label(n) for n in differ])}"]
    return _lines(differ, per_file, f"{_count(differ)} from the manifest")


def _count(files: list[str]) -> str:
    return f"{len(files)} file differs" if len(files) == 1 else f"{len(files)} files differ"


def across_nodes(nodes: list[NodeDigests]) -> dict[int, list[str]]:
    """Nodes whose digests differ from the majority's, each with the files that differ (no majority: every node)."""
    if len(nodes) < 2:
        return {}
    names = sorted({n for node in nodes for n in node.files} - {n for node in nodes for n in node.known_bad})
    majority: dict[str, Digest | None] = {}
    split: list[str] = []
    for name in names:
        counts = Counter(node.files.get(name) for node in nodes)
        (top, count), = counts.most_common(1)
        if count * 2 > len(nodes):
            majority[name] = top
        elif len(counts) > 1:
            split.append(name)
    out: dict[int, list[str]] = {}
    for node in nodes:
        differ = sorted(n for n, d in majority.items() if node.files.get(n) != d)
        others = [o for o in nodes if o.rank != node.rank and all(o.files.get(n) == majority[n] for n in differ)]
        if differ:
            out[node.rank] = [_difference(node, differ, others)]
        if split:
            out.setdefault(node.rank, []).append(
                f"no majority across {len(nodes)} nodes for {listed([label(n) for n in split])}: the copies disagree")
    return out


def _difference(node: NodeDigests, differ: list[str], others: list[NodeDigests]) -> str:
    revisions = Counter(o.revision for o in others if o.revision)
    theirs = revisions.most_common(1)[0][0] if revisions else None
    peers = f"{len(others)} other{'s' * (len(others) != 1)}"
    if node.revision and theirs and node.revision != theirs:
        return f"revision {node.revision} vs {theirs} on {peers}; {_count(differ)}: {listed([label(n) for n in differ])}"
    if all(n not in node.files for n in differ):
        return f"{listed([label(n) for n in differ])} missing here, present on {peers}"
    verb = "differs" if len(differ) == 1 else "differ"
    return f"{listed([label(n) for n in differ])} {verb} from the {peers}"
