"""The hybrid prefix cache: the reference worked example, turns, eviction, copy-on-hit and properties."""

from __future__ import annotations

import random

import pytest

from k3deploy.sim.prefix_cache import Hit, PrefixCache

pytestmark = pytest.mark.timeout(60)


def _tokens(seed: int, n: int, vocab: int = 1024) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _worked_example(cache: PrefixCache[bytes]) -> Hit:
    """Cache a sequence checkpointed at turn ends 1024 and 2560; query one sharing its first 2800 tokens."""
    shared = _tokens(1, 2800)
    cache.insert(shared + _tokens(2, 1200), turn_boundaries=[1024, 2560], state_at=lambda t: b"kda@%d" % t)
    return cache.lookup(shared + _tokens(3, 200))


def test_worked_example_exact_with_16_token_hash_blocks() -> None:
    # 16 = gcd(1024, 2560, 2800): the largest hash block for which the reference's matched 2800 is itself
    # hash-aligned, so matched comes out as exactly 2800. The interval is off so the only checkpoints are
    # the two turn boundaries of the example.
    cache: PrefixCache[bytes] = PrefixCache(hash_block_tokens=16, checkpoint_interval_blocks=None)
    hit = _worked_example(cache)
    assert hit == Hit(matched_tokens=2800, hit_tokens=2560)
    assert round(hit.hit_tokens / hit.matched_tokens, 2) == 0.91  # "91% of prefill saved"
    assert cache.checkpoints(_tokens(1, 2800)) == [1024, 2560]


def test_worked_example_with_production_512_token_hash_blocks() -> None:
    # With 512-token hash blocks, 1024 and 2560 are block endpoints (2 and 5 blocks) but 2800 is not:
    # chained-hash matching rounds the 2800 shared tokens down to 2560, and the hit is still 2560.
    cache: PrefixCache[bytes] = PrefixCache(hash_block_tokens=512, checkpoint_interval_blocks=None)
    assert _worked_example(cache) == Hit(matched_tokens=2560, hit_tokens=2560)


@pytest.mark.parametrize("hash_block_tokens", [16, 512])
def test_worked_example_coarse_only_reuses_nothing(hash_block_tokens: int) -> None:
    # Whole 6144-token physical blocks only: 2800 shared tokens do not fill one, so nothing is reusable.
    cache: PrefixCache[bytes] = PrefixCache(hash_block_tokens=hash_block_tokens, coarse_only=True)
    assert _worked_example(cache) == Hit(matched_tokens=0, hit_tokens=0)


def test_coarse_only_hits_at_physical_block_ends() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=16, physical_block_tokens=64, coarse_only=True)
    seq = _tokens(4, 200)
    cache.insert(seq, turn_boundaries=[100])  # turn boundaries are ignored: checkpoints sit at page ends
    assert cache.checkpoints(seq) == [64, 128, 192]
    assert cache.lookup(seq[:150] + _tokens(5, 50)) == Hit(matched_tokens=128, hit_tokens=128)


def test_two_turn_conversation_hits_the_turn_boundary() -> None:
    cache: PrefixCache[bytes] = PrefixCache()  # production sizes: 512-token hash blocks, interval 4
    prompt1, answer1 = _tokens(10, 1300), _tokens(11, 700)
    turn1 = prompt1 + answer1  # 2000 tokens: the end of turn 1 falls inside hash block 4
    assert cache.lookup(prompt1).hit_tokens == 0
    cache.insert(turn1, turn_boundaries=[len(turn1)], state_at=lambda t: b"kda@%d" % t)
    prompt2 = turn1 + _tokens(12, 900)
    acquired = cache.acquire(prompt2)
    assert acquired.hit == Hit(matched_tokens=1536, hit_tokens=1536)  # 2000 rounded down to 3 x 512
    assert acquired.state == b"kda@1536"


def test_long_conversation_prefers_turn_boundaries_then_the_interval() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=16, checkpoint_interval_blocks=4)
    seq = _tokens(20, 16 * 13)
    cache.insert(seq, turn_boundaries=[16 * 2 + 5, 16 * 9])
    # Boundary at 37 -> 32 (block 2); then every 4 blocks from the last checkpoint: 6; boundary 9; 13.
    assert cache.checkpoints(seq) == [16 * b for b in (2, 6, 9, 13)]
    assert cache.lookup(seq[: 16 * 8 + 3]) == Hit(matched_tokens=16 * 8, hit_tokens=16 * 6)


def test_a_branch_reuses_the_shared_prefix_checkpoint() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=8, physical_block_tokens=32)
    system = _tokens(30, 24)
    cache.insert(system + _tokens(31, 40), turn_boundaries=[24])
    cache.insert(system + _tokens(32, 40), turn_boundaries=[24])
    assert cache.lookup(system + _tokens(33, 40)) == Hit(matched_tokens=24, hit_tokens=24)
    # The second branch diverges mid-page, so it needs its own physical blocks: 2 + 2 pages.
    assert cache.used_tokens == 4 * 32


def test_eviction_is_lru_within_the_budget() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=4, physical_block_tokens=8, capacity_tokens=16)
    a, b, c = _tokens(40, 8), _tokens(41, 8), _tokens(42, 8)
    for seq in (a, b):
        cache.insert(seq, turn_boundaries=[8])
    assert cache.used_tokens == 16
    cache.lookup(a)  # a becomes most recently used, so b is the LRU page
    cache.insert(c, turn_boundaries=[8])
    assert cache.counters.evictions == 1
    assert cache.lookup(b) == Hit(0, 0)
    assert cache.lookup(a) == Hit(8, 8) and cache.lookup(c) == Hit(8, 8)
    assert cache.used_tokens <= 16


def test_eviction_never_strands_a_cached_descendant() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=4, physical_block_tokens=8, capacity_tokens=24)
    long_seq, other = _tokens(50, 24), _tokens(51, 8)
    cache.insert(long_seq, turn_boundaries=[8, 16, 24])  # three pages, all equally recent
    cache.insert(other, turn_boundaries=[8])
    # Only the tail page of long_seq is a leaf; its ancestors stay because a descendant needs them.
    assert cache.lookup(long_seq) == Hit(16, 16)
    assert cache.lookup(other) == Hit(8, 8)
    assert cache.counters.evictions == 1


def test_copy_on_hit_isolates_requests_from_the_checkpoint() -> None:
    cache: PrefixCache[bytearray] = PrefixCache(hash_block_tokens=4, physical_block_tokens=8)
    seq = _tokens(60, 8)
    live = bytearray(b"state-at-8")
    cache.insert(seq, turn_boundaries=[8], state_at=lambda _t: live)
    live[0:5] = b"XXXXX"  # the caller's live state moves on after insert
    first = cache.acquire(seq)
    assert first.state == bytearray(b"state-at-8")
    assert first.state is not None
    first.state[:] = b"mutated by request 1"
    assert cache.acquire(seq).state == bytearray(b"state-at-8")


def test_disabled_cache_always_returns_zero() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=4, enabled=False)
    seq = _tokens(70, 64)
    assert cache.insert(seq, turn_boundaries=[64]) == 0
    assert cache.lookup(seq) == Hit(0, 0)
    assert cache.acquire(seq).state is None
    assert cache.used_tokens == 0
    assert (cache.counters.queries, cache.counters.hits) == (128, 0)


def test_counters_track_queried_and_reused_tokens() -> None:
    cache: PrefixCache[None] = PrefixCache(hash_block_tokens=4, physical_block_tokens=8)
    seq = _tokens(80, 20)
    assert cache.insert(seq, turn_boundaries=[12]) == 20  # 5 full blocks newly cached
    assert cache.insert(seq) == 0
    cache.lookup(seq)
    cache.acquire(seq[:14])
    cache.lookup(seq[:10])  # 2 blocks matched, but no checkpoint inside them
    assert (cache.counters.queries, cache.counters.hits, cache.counters.evictions) == (44, 12 + 12, 0)


def test_invalid_geometry_is_rejected() -> None:
    with pytest.raises(ValueError):
        PrefixCache(hash_block_tokens=16, physical_block_tokens=100)
    with pytest.raises(ValueError):
        PrefixCache(hash_block_tokens=16, checkpoint_interval_blocks=0)


def test_turn_boundary_outside_tokens_is_rejected() -> None:
    with pytest.raises(ValueError):
        PrefixCache[None](hash_block_tokens=4).insert([1, 2, 3, 4], turn_boundaries=[5])


def _family(rng: random.Random, count: int) -> list[list[int]]:
    """Sequences that share random prefixes with each other, as conversations and agents do."""
    seqs: list[list[int]] = []
    for _ in range(count):
        if seqs and rng.random() < 0.7:
            base = rng.choice(seqs)
            cut = rng.randrange(len(base) + 1)
            seqs.append(base[:cut] + [rng.randrange(8) for _ in range(rng.randrange(40))])
        else:
            seqs.append([rng.randrange(8) for _ in range(rng.randrange(1, 60))])
    return seqs


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("seed", range(12))
def test_properties_on_random_sequences(seed: int) -> None:
    rng = random.Random(seed)
    size_h = rng.choice([1, 2, 4, 8])
    cache: PrefixCache[int] = PrefixCache(
        hash_block_tokens=size_h,
        physical_block_tokens=size_h * rng.choice([1, 3, 4]),
        checkpoint_interval_blocks=rng.choice([None, 1, 3]),
    )
    inserted: list[list[int]] = []
    for seq in _family(rng, 30):
        hit = cache.acquire(seq)
        assert hit.hit.hit_tokens <= hit.hit.matched_tokens <= len(seq)
        assert hit.hit.matched_tokens % size_h == 0 and hit.hit.hit_tokens % size_h == 0
        # Unbounded cache: matched is exactly the longest hash-aligned prefix shared with any inserted sequence.
        best = max((min(_common_prefix(seq, s), len(s)) for s in inserted), default=0)
        assert hit.hit.matched_tokens == best // size_h * size_h
        if hit.hit.hit_tokens:
            assert hit.hit.hit_tokens in cache.checkpoints(seq)
            assert hit.state == hit.hit.hit_tokens  # the state recorded at exactly that endpoint
        else:
            assert hit.state is None
        boundaries = sorted(rng.sample(range(len(seq) + 1), k=min(2, len(seq) + 1)))
        cache.insert(seq, turn_boundaries=boundaries, state_at=lambda t: t)
        inserted.append(seq)


@pytest.mark.parametrize("seed", range(8))
def test_properties_under_a_tight_budget(seed: int) -> None:
    rng = random.Random(100 + seed)
    cache: PrefixCache[None] = PrefixCache(
        hash_block_tokens=4, physical_block_tokens=8, capacity_tokens=8 * rng.randrange(1, 6)
    )
    for seq in _family(rng, 40):
        cache.insert(seq, turn_boundaries=[len(seq)])
        assert cache.used_tokens <= (cache.capacity_tokens or 0)
        hit = cache.lookup(seq)
        assert hit.hit_tokens <= hit.matched_tokens <= len(seq)
        # Prefix closure: a cached block implies all of its ancestors are still cached.
        for cut in range(0, len(seq) + 1, 4):
            assert cache.lookup(seq[:cut]).matched_tokens == min(cut, hit.matched_tokens)
