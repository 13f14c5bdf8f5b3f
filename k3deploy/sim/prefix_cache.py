"""Hybrid-model prefix cache: fine hash blocks match, coarse pages hold memory, KDA checkpoints are sparse."""

from __future__ import annotations

import copy
import hashlib
import itertools
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")

_ROOT_DIGEST = b"k3deploy.sim.prefix_cache/v1"


@dataclass(frozen=True)
class Hit:
    """Result of a lookup: tokens matched by chained hash blocks, and tokens actually reusable."""

    matched_tokens: int
    hit_tokens: int


@dataclass(frozen=True)
class Acquired(Generic[S]):
    """A hit plus the request's private copy of the KDA state at hit_tokens (None when nothing hit)."""

    hit: Hit
    state: S | None


@dataclass
class CacheCounters:
    """Running totals for metrics: tokens looked up, tokens reused, physical blocks evicted."""

    queries: int = 0
    hits: int = 0
    evictions: int = 0


@dataclass(frozen=True)
class _Checkpoint(Generic[S]):
    state: S | None


class _Page:
    """One physical block: a run of hash blocks along one path inside one aligned window."""

    __slots__ = ("child_pages", "last_used", "nodes", "parent", "serial")

    def __init__(self, serial: int, parent: _Node | None) -> None:
        self.serial = serial
        self.nodes: list[_Node] = []
        self.parent = parent
        self.child_pages = 0
        self.last_used = 0


class _Node:
    """One hash block; `blocks` is its endpoint counted in hash blocks."""

    __slots__ = ("blocks", "checkpoint", "children", "digest", "page")

    def __init__(self, digest: bytes, blocks: int, page: _Page) -> None:
        self.digest = digest
        self.blocks = blocks
        self.page = page
        self.children: dict[bytes, _Node] = {}
        self.checkpoint: _Checkpoint[object] | None = None


class PrefixCache(Generic[S]):
    """Prefix cache whose hits land only where both MLA KV and a persisted KDA checkpoint exist."""

    def __init__(
        self,
        *,
        hash_block_tokens: int = 512,
        physical_block_tokens: int = 6144,
        checkpoint_interval_blocks: int | None = 4,
        capacity_tokens: int | None = None,
        coarse_only: bool = False,
        enabled: bool = True,
    ) -> None:
        if hash_block_tokens < 1 or physical_block_tokens % hash_block_tokens or physical_block_tokens < 1:
            raise ValueError("physical_block_tokens must be a positive multiple of hash_block_tokens")
        if checkpoint_interval_blocks is not None and checkpoint_interval_blocks < 1:
            raise ValueError("checkpoint_interval_blocks must be >= 1 or None")
        self.hash_block_tokens = hash_block_tokens
        self.physical_block_tokens = physical_block_tokens
        self.checkpoint_interval_blocks = checkpoint_interval_blocks
        self.capacity_tokens = capacity_tokens
        self.coarse_only = coarse_only
        self.enabled = enabled
        self.counters = CacheCounters()
        self._blocks_per_page = physical_block_tokens // hash_block_tokens
        self._roots: dict[bytes, _Node] = {}
        self._pages: set[_Page] = set()
        self._tick = itertools.count(1)
        self._serial = itertools.count()

    @property
    def used_tokens(self) -> int:
        """Memory in use, in tokens: allocated physical blocks x physical_block_tokens."""
        return len(self._pages) * self.physical_block_tokens

    def clear(self) -> None:
        """Forget every cached block and checkpoint (a flush); counters keep counting."""
        self._roots.clear()
        self._pages.clear()

    def lookup(self, tokens: Sequence[int], salt: str = "") -> Hit:
        """Match tokens against the cache, refresh LRU order and count the query."""
        return self._find(tokens, salt)[0]

    def acquire(self, tokens: Sequence[int], salt: str = "") -> Acquired[S]:
        """Look up tokens and return a private copy of the checkpointed state at the hit (copy-on-hit)."""
        hit, node = self._find(tokens, salt)
        if node is None or node.checkpoint is None:
            return Acquired(hit=hit, state=None)
        # The stored checkpoint is shared by every future hit, so the request only ever gets a copy.
        state: S | None = copy.deepcopy(node.checkpoint.state)  # type: ignore[assignment]
        return Acquired(hit=hit, state=state)

    def checkpoints(self, tokens: Sequence[int], salt: str = "") -> list[int]:
        """Token endpoints with a persisted checkpoint along the cached prefix of tokens (no side effects)."""
        return [n.blocks * self.hash_block_tokens for n in self._walk(tokens, salt) if n.checkpoint is not None]

    def insert(
        self,
        tokens: Sequence[int],
        *,
        turn_boundaries: Iterable[int] = (),
        state_at: Callable[[int], S] | None = None,
        salt: str = "",
    ) -> int:
        """Cache the full hash blocks of tokens with sparse KDA checkpoints; return tokens newly cached.

        A salt (vLLM's per-request `cache_salt`) enters the first block's digest: only requests with the same
        salt share these blocks."""
        if not self.enabled:
            return 0
        size_h = self.hash_block_tokens
        boundaries = set()
        for boundary in turn_boundaries:
            if not 0 <= boundary <= len(tokens):
                raise ValueError(f"turn boundary {boundary} outside 0..{len(tokens)}")
            boundaries.add(boundary // size_h)  # a mid-block boundary falls back to the block start
        parent: _Node | None = None
        last_checkpoint, created = 0, 0
        path: list[_Node] = []
        for digest in self._digests(tokens, salt):
            siblings = parent.children if parent is not None else self._roots
            node = siblings.get(digest)
            if node is None:
                node = self._new_node(digest, parent)
                siblings[digest] = node
                created += 1
            if node.checkpoint is None and self._wants_checkpoint(node.blocks, last_checkpoint, boundaries):
                state = state_at(node.blocks * size_h) if state_at is not None else None
                # Snapshot now: the caller keeps mutating its live state after insert returns.
                node.checkpoint = _Checkpoint(copy.deepcopy(state))
            if node.checkpoint is not None:
                last_checkpoint = node.blocks
            path.append(node)
            parent = node
        tick = next(self._tick)
        for node in path:
            node.page.last_used = tick
        self._evict_to_budget()
        return created * size_h

    def _wants_checkpoint(self, blocks: int, last_checkpoint: int, boundaries: set[int]) -> bool:
        if self.coarse_only:
            return blocks % self._blocks_per_page == 0
        if blocks in boundaries:
            return True
        interval = self.checkpoint_interval_blocks
        return interval is not None and blocks - last_checkpoint >= interval

    def _new_node(self, digest: bytes, parent: _Node | None) -> _Node:
        blocks = parent.blocks + 1 if parent is not None else 1
        mid_window = (blocks - 1) % self._blocks_per_page != 0
        if parent is not None and mid_window and parent.page.nodes[-1] is parent:
            page = parent.page
        else:
            # A new window, or a branch off the middle of a page: a branch cannot share the
            # parent's physical block, so it costs a whole new one.
            page = _Page(next(self._serial), parent)
            self._pages.add(page)
            if parent is not None:
                parent.page.child_pages += 1
        node = _Node(digest, blocks, page)
        page.nodes.append(node)
        return node

    def _evict_to_budget(self) -> None:
        if self.capacity_tokens is None:
            return
        while self._pages and self.used_tokens > self.capacity_tokens:
            # Only pages no other page hangs off: an ancestor is needed by every cached descendant.
            leaves = [p for p in self._pages if p.child_pages == 0]
            victim = min(leaves, key=lambda p: (p.last_used, p.serial))
            first = victim.nodes[0]
            parent = victim.parent
            siblings = parent.children if parent is not None else self._roots
            del siblings[first.digest]
            if parent is not None:
                parent.page.child_pages -= 1
            self._pages.remove(victim)
            self.counters.evictions += 1

    def _find(self, tokens: Sequence[int], salt: str) -> tuple[Hit, _Node | None]:
        self.counters.queries += len(tokens)
        if not self.enabled:
            return Hit(0, 0), None
        path = self._walk(tokens, salt)
        tick = next(self._tick)
        for node in path:
            node.page.last_used = tick
        if self.coarse_only:
            path = path[: len(path) // self._blocks_per_page * self._blocks_per_page]
        matched = len(path) * self.hash_block_tokens
        hit_node = next((n for n in reversed(path) if n.checkpoint is not None), None)
        hit_tokens = hit_node.blocks * self.hash_block_tokens if hit_node is not None else 0
        self.counters.hits += hit_tokens
        return Hit(matched_tokens=matched, hit_tokens=hit_tokens), hit_node

    def _walk(self, tokens: Sequence[int], salt: str) -> list[_Node]:
        path: list[_Node] = []
        siblings = self._roots
        for digest in self._digests(tokens, salt):
            node = siblings.get(digest)
            if node is None:
                break
            path.append(node)
            siblings = node.children
        return path

    def _digests(self, tokens: Sequence[int], salt: str = "") -> Iterator[bytes]:
        """Yield chained digests of the full hash blocks of tokens, lazily (a salt changes every one)."""
        digest, size_h = _ROOT_DIGEST, self.hash_block_tokens
        if salt:
            digest = hashlib.blake2b(digest + b"\0salt\0" + salt.encode(), digest_size=16).digest()
        for start in range(0, len(tokens) - size_h + 1, size_h):
            block = array("q", tokens[start : start + size_h]).tobytes()
            # Chaining makes a block's digest name its whole prefix; 128 bits keeps collisions negligible.
            digest = hashlib.blake2b(digest + block, digest_size=16).digest()
            yield digest
