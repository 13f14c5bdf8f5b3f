"""Digest agreement: against a manifest, and across nodes by majority (pure functions, exact messages)."""
from __future__ import annotations

from k3deploy.checkpoint.manifest import FileDigest, Manifest
from k3deploy.validate.compare import NodeDigests, across_nodes, against_manifest

A, B = "a" * 64, "b" * 64
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def node(rank: int, s1: str, s2: str | None = A, revision: str | None = "9c1e2d0") -> NodeDigests:
    files = {S1: (10, s1), **({S2: (10, s2)} if s2 else {})}
    return NodeDigests(rank, files, revision)


def test_majority_names_the_odd_node_and_its_files() -> None:
    found = across_nodes([node(0, A), node(1, A), node(2, B), node(3, A)])
    assert found == {2: ["shard 00001 differs from the 3 others"]}


def test_a_node_on_another_revision_is_named_with_both_revisions() -> None:
    nodes = [node(0, A), node(1, A), node(2, A), node(3, B, B, revision="f831ab6")]
    assert across_nodes(nodes) == {3: [("revision f831ab6 vs 9c1e2d0 on 3 others; 2 files differ: shard 00001, "
                                       "shard 00002")]}


def test_missing_files_and_a_split_without_majority() -> None:
    assert across_nodes([node(0, A), node(1, A, None), node(2, A)]) == {
        1: ["shard 00002 missing here, present on 2 others"]}
    split = across_nodes([node(0, A), node(1, A), node(2, B), node(3, B)])
    assert set(split) == {0, 1, 2, 3}
    assert split[0] == ["no majority across 4 nodes for shard 00001: the copies disagree"]
    assert across_nodes([node(0, A)]) == {}


def test_against_the_manifest_per_file_then_summarised() -> None:
    manifest = Manifest(revision="9c1e2d0", files={S1: FileDigest(size=10, sha256=A), S2: FileDigest(size=12, sha256=A)})
    assert against_manifest(node(0, B), manifest) == [
        f"shard 00001: sha256 {B[:12]}… differs from the manifest's {A[:12]}…",
        "shard 00002: 10 bytes, the manifest says 12"]
    assert against_manifest(node(0, B, None, revision="f831ab6"), manifest) == [
        "revision f831ab6, the manifest's is 9c1e2d0; 2 files differ: shard 00001, shard 00002"]
    clean = NodeDigests(0, {S1: (10, A), S2: (12, A)}, "9c1e2d0")
    assert against_manifest(clean, manifest) == []
    broken = NodeDigests(0, {S1: (10, A)}, "9c1e2d0", known_bad=frozenset({S2}))
    assert against_manifest(broken, manifest) == []  # already reported by the structural check
