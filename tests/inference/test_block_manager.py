"""Block accounting without a model: exact block ids for allocation, sharing, copy-on-write, eviction."""

import pytest

from inference.block_manager import BlockManager
from inference.sampling_params import SamplingParams
from inference.sequence import Request


def make_seq(tokens, n=1, salt=None, request_id="r"):
    return Request(request_id, None, list(tokens), SamplingParams(n=n), eos_token_id=None, cache_salt=salt).seqs[0]


def run_chunk(bm, seq, num_tokens):
    """What one engine step does to the accounting: allocate, 'compute', register full blocks."""
    assert bm.allocate(seq, num_tokens)
    bm.take_pending_copies()
    seq.num_computed_tokens += num_tokens
    bm.cache_full_blocks(seq)


def test_blocks_allocated_only_at_boundaries():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    seq = make_seq(range(5))
    run_chunk(bm, seq, 5)
    assert seq.block_table == [0, 1]
    for token in range(3):  # positions 5, 6, 7 fit in block 1
        seq.token_ids.append(100 + token)
        run_chunk(bm, seq, 1)
        assert seq.block_table == [0, 1]
    seq.token_ids.append(200)
    run_chunk(bm, seq, 1)
    assert seq.block_table == [0, 1, 2]
    bm.check_integrity([seq])
    bm.free(seq)
    bm.check_integrity([])
    assert bm.pool.num_free_blocks == 8


def test_allocation_fails_cleanly_when_pool_is_short():
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    seq = make_seq(range(12))
    assert not bm.allocate(seq, 12)
    assert seq.block_table == [] and bm.pool.num_free_blocks == 2
    bm.check_integrity([])


def test_prefix_hit_reuses_full_blocks_and_leaves_last_token():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_seq(range(10))
    run_chunk(bm, first, 10)
    first_blocks = list(first.block_table)
    bm.free(first)
    assert bm.pool.num_cached_blocks == 2  # two full blocks cached, the partial one is not

    same_prefix = make_seq(list(range(8)) + [77, 78])
    hits = bm.find_cached_prefix(same_prefix)
    assert hits == first_blocks[:2]
    bm.admit(same_prefix, hits)
    assert same_prefix.num_computed_tokens == 8
    bm.check_integrity([same_prefix])

    whole = make_seq(range(8))  # whole prompt cached: the last block must still be computed
    assert bm.find_cached_prefix(whole) == hits[:1]


def test_cache_salt_separates_prefixes():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    seq = make_seq(range(9), salt="alice")
    run_chunk(bm, seq, 9)
    bm.free(seq)
    assert bm.find_cached_prefix(make_seq(range(9), salt="bob")) == []
    assert len(bm.find_cached_prefix(make_seq(range(9), salt="alice"))) == 2


def test_lru_eviction_evicts_least_recently_freed_and_deepest_first():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 5])
    run_chunk(bm, a, 5)  # blocks 0, 1 full and cached, block 2 partial
    bm.free(a)
    assert list(bm.pool.free_block_queue) == [2, 3, 1, 0]  # uncached first, then deepest cached first
    b = make_seq([9, 9, 9, 9, 9, 9, 9])
    run_chunk(bm, b, 7)  # needs 4 blocks: takes the two uncached ones, then evicts 1, then 0
    assert b.block_table == [2, 3, 1, 0]
    assert bm.pool.num_evictions == 2
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5])) == []
    bm.check_integrity([b])


def test_fork_shares_blocks_and_copy_on_write_splits_the_partial_block():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    parent = make_seq(range(6), n=2)
    run_chunk(bm, parent, 6)
    child = parent.request.new_sequence(1, list(parent.token_ids))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table == [0, 1]
    assert [bm.pool.blocks[b].ref_count for b in (0, 1)] == [2, 2]

    parent.token_ids.append(50)
    assert bm.allocate(parent, 1)  # writes into shared block 1: copy on write
    assert bm.take_pending_copies() == [(1, 2)]
    assert parent.block_table == [0, 2] and child.block_table == [0, 1]
    parent.num_computed_tokens += 1

    child.token_ids.append(60)
    assert bm.allocate(child, 1)  # block 1 now has one owner: written in place
    assert bm.take_pending_copies() == []
    child.num_computed_tokens += 1
    assert bm.num_cow_copies == 1
    bm.check_integrity([parent, child])
    bm.free(parent)
    bm.free(child)
    bm.check_integrity([])


def test_release_below_zero_is_caught():
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    with pytest.raises(AssertionError):
        bm.pool.release(0)


def test_reset_prefix_cache_forgets_only_unused_blocks():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    kept = make_seq([1, 2, 3, 4, 5], request_id="kept")
    run_chunk(bm, kept, 5)
    gone = make_seq([7, 8, 9], request_id="gone")
    run_chunk(bm, gone, 3)
    bm.free(gone)
    assert bm.pool.reset_prefix_cache() == 1
    assert bm.find_cached_prefix(make_seq([7, 8, 9])) == []
    assert len(bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5]))) == 2
    bm.check_integrity([kept])
