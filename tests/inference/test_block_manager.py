"""Block accounting without a model: exact block ids for allocation, sharing, copy-on-write, eviction."""

import subprocess
import sys
from pathlib import Path

import pytest

from inference.block_manager import BlockManager, IntegrityError
from inference.sampling_params import SamplingParams
from inference.sequence import Request

REPO = Path(__file__).resolve().parents[2]


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
    assert (bm.pool.num_cached_blocks, bm.pool.num_used_blocks) == (2, 0)
    b = make_seq([9, 9, 9, 9, 9, 9, 9])
    run_chunk(bm, b, 7)  # needs 4 blocks: takes the two uncached ones, then evicts 1, then 0
    assert b.block_table == [2, 3, 1, 0]
    assert bm.pool.num_evictions == 2
    assert (bm.pool.num_cached_blocks, bm.pool.num_used_blocks) == (0, 4)
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
    assert bm.pool.num_shared_blocks == 2

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
    assert bm.pool.num_shared_blocks == 1  # block 0 only
    bm.check_integrity([parent, child])
    bm.free(parent)
    bm.free(child)
    assert (bm.pool.num_shared_blocks, bm.pool.num_used_blocks, bm.pool.num_cached_blocks) == (0, 0, 1)
    bm.check_integrity([])


def test_integrity_check_catches_a_wrong_block_count():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    seq = make_seq([1, 2, 3])
    run_chunk(bm, seq, 3)
    bm.pool.num_shared_blocks += 1
    with pytest.raises(IntegrityError, match="shared-block count 1, recounted 0"):
        bm.check_integrity([seq])


def test_release_below_zero_is_caught():
    bm = BlockManager(num_blocks=2, block_size=4, enable_prefix_caching=False)
    with pytest.raises(IntegrityError, match="ref count 0"):
        bm.pool.release(0)


def test_reset_prefix_cache_forgets_only_unused_blocks():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    kept = make_seq([1, 2, 3, 4, 5], request_id="kept")
    run_chunk(bm, kept, 5)
    gone = make_seq([7, 8, 9], request_id="gone")
    run_chunk(bm, gone, 3)
    bm.free(gone)
    assert bm.pool.num_cached_blocks == 1
    assert bm.pool.reset_prefix_cache() == 1
    assert bm.pool.num_cached_blocks == 0
    assert bm.find_cached_prefix(make_seq([7, 8, 9])) == []
    assert len(bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5]))) == 2
    bm.check_integrity([kept])


def test_a_hash_collision_is_a_miss_never_another_prefix(monkeypatch):
    """A block hash that sees only the block's last token: [1 2 3 4] and [9 9 9 4] collide, and so do their
    children [5 6 7 8]. The child cached under [9 9 9 4] must not serve a prompt starting [1 2 3 4]."""
    monkeypatch.setattr("inference.block_manager.hash_block_tokens", lambda parent, tokens, extra=(): tokens[-1])
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = make_seq([1, 2, 3, 4, 0], request_id="a")
    run_chunk(bm, a, 5)
    a_first = a.block_table[0]
    b = make_seq([9, 9, 9, 4, 5, 6, 7, 8, 0], request_id="b")
    assert bm.find_cached_prefix(b) == []  # same hash as a's first block, other tokens
    run_chunk(bm, b, 9)  # b's first block stays unindexed (hash taken); its second is indexed
    b_second = b.block_table[1]
    assert bm.pool.blocks[b_second].block_hash is not None
    bm.free(a)
    bm.free(b)
    c = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0], request_id="c")
    assert bm.find_cached_prefix(c) == [a_first]  # not [a_first, b_second]: b_second sits on [9 9 9 4]
    bm.check_integrity([])


def test_a_constant_hash_serves_only_exact_blocks(monkeypatch):
    monkeypatch.setattr("inference.block_manager.hash_block_tokens", lambda parent, tokens, extra=(): 0)
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    first = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0], salt="alice")
    run_chunk(bm, first, 9)
    first_blocks = list(first.block_table)
    bm.free(first)
    assert bm.find_cached_prefix(make_seq([5, 6, 7, 8, 1, 2, 3, 4, 0], salt="alice")) == []
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0], salt="bob")) == []
    # Every block hashes to 0, so only the first block could be indexed; it still serves its own prefix.
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5, 6, 7, 8, 0], salt="alice")) == first_blocks[:1]


def test_a_parent_evicted_and_reused_no_longer_vouches_for_its_child():
    bm = BlockManager(num_blocks=3, block_size=2, enable_prefix_caching=True)
    first = make_seq([1, 2, 3, 4, 0])
    run_chunk(bm, first, 5)
    parent, child = first.block_table[:2]
    bm.free(first)
    # Take the partial block and the child's parent; the parent is recomputed with the same tokens,
    # so its hash comes back, but its generation moved on.
    other = make_seq([1, 2, 7])
    bm.pool.touch(child)  # keep the child cached and out of the eviction order
    bm.pool.reset_prefix_cache()  # drops only the unused parent
    run_chunk(bm, other, 3)
    bm.pool.release(child)
    assert parent in other.block_table
    assert bm.find_cached_prefix(make_seq([1, 2, 3, 4, 0])) == [parent]
    bm.free(other)
    bm.check_integrity([])


def test_integrity_check_survives_python_optimize(tmp_path):
    """`python -O` strips assert statements; the checker must still raise on a corrupted pool."""
    script = (
        "from inference.block_manager import BlockManager, IntegrityError\n"
        "assert False, 'asserts are on'\n"  # stripped under -O: proves the mode
        "bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True)\n"
        "bm.pool.blocks[2].ref_count = 1\n"
        "try:\n"
        "    bm.check_integrity([])\n"
        "except IntegrityError as exc:\n"
        "    print('caught:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "caught: block 2: ref count 1, held by 0"
