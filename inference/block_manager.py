"""Paged KV memory: the physical block pool and the per-sequence block tables that map onto it.

A sequence's i-th *logical* block is `seq.block_table[i]`, an index into the *physical* KV cache
`key_cache[num_blocks, block_size, kv_heads, head_dim]`. Blocks are handed out one at a time, only when a
sequence's context crosses a block boundary, so a sequence wastes at most the unfilled tail of its last
block.

Sharing is by reference counting. A block's `ref_count` is the number of live block tables holding it.
Full blocks also get a *block hash* (parent block's hash, the block's token ids, extra keys such as a
cache salt); with prefix caching on, a new sequence whose prompt starts with the same tokens reuses those
blocks instead of recomputing them. A block whose ref count drops to 0 keeps its hash and contents: it
is *cached*, and only becomes free for reuse when the pool runs out of never-used blocks, least recently
freed first (LRU eviction).

The hash only finds a candidate; it is never trusted. A cached block also keeps its exact `BlockKey`: its
token ids, its extra keys and the physical block (with that block's generation) its K/V were computed on.
A hit is taken only when the candidate's key equals the requester's, so by induction along the prefix a
hit's K/V are exactly what the requester would compute: a hash collision (Python's `hash()` is 64 bits and
not collision resistant) costs a cache miss, never another request's KV. BENCHMARKS.md ("Block hashes")
measures this against sha256, which would make collisions infeasible rather than harmless, at 5-9x the
hashing cost.

Block states (each block is in exactly one):
    free    ref_count == 0, no hash              -> in free_block_queue
    cached  ref_count == 0, hashed                -> in free_block_queue and cached_block_hash_to_block
    used    ref_count >= 1 (hashed or not)        -> in no queue

`check_integrity()` checks these invariants and the ones in DESIGN.md, raising `IntegrityError` (not
`assert`, which `python -O` strips); tests call it after every scenario.
Every change of a ref count, a hash or a block table is also emitted into the engine's `EventLog`
(inference/events.py), from which `BlockMapReplay` rebuilds the same `PoolView` that `view()` returns.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from inference.events import (
    BlockAllocated, BlockCached, BlockEvicted, BlocksFreed, BlockTouched, CacheReset, CopyOnWrite, EventLog,
    Forked, hash_label,
)
from inference.pool_view import PoolView
from inference.sequence import Sequence


class IntegrityError(RuntimeError):
    """A block-accounting invariant is broken: a bug in the engine, never a bad request."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise IntegrityError(message)


class BlockKey(NamedTuple):
    """What a full block's K/V depend on, exactly: its tokens, its extra keys, and the block before it.

    `parent` is the (block id, generation) of the physical block the K/V were computed on; a block's
    generation changes whenever it is handed out again, so a parent that was evicted and reused no
    longer matches.
    """

    parent: tuple[int, int] | None
    token_ids: tuple[int, ...]
    extra_keys: tuple = ()


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    key: BlockKey | None = None
    generation: int = 0


def hash_block_tokens(parent_hash: int | None, token_ids: tuple[int, ...], extra_keys: tuple = ()) -> int:
    """The prefix-cache index of one full block: it depends on every token before it through the parent.

    Only an index: a lookup's candidate is checked against its `BlockKey` before it is used.
    """
    return hash((parent_hash, token_ids, extra_keys))


class BlockPool:
    """All physical blocks, their ref counts, the LRU free queue and the hash index of cached blocks.

    `free_block_queue` holds every block with ref count 0, in eviction order: never-used and uncached
    blocks at the front (handed out first), cached blocks appended at the back when released, so the
    least recently released cached block is evicted first.

    `num_cached_blocks` (ref count 0 and hashed) and `num_shared_blocks` (ref count > 1) are kept as counters
    at every transition, so figures sampled every step cost nothing per block: a GPU pool holds hundreds of
    thousands. `BlockManager.check_integrity` recounts both.
    """

    def __init__(self, num_blocks: int, enable_caching: bool, events: EventLog | None = None) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.events = events or EventLog()
        self.free_block_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached_block_hash_to_block: dict[int, int] = {}
        self.num_evictions = 0
        self.num_cached_blocks = 0
        self.num_shared_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free or evictable cached)."""
        return len(self.free_block_queue)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref count >= 1: every other block is in the free queue."""
        return len(self.blocks) - len(self.free_block_queue)

    def get_new_block(self) -> int:
        block_id, _ = self.free_block_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            self._evict(block)
        block.ref_count = 1
        block.generation += 1
        return block_id

    def touch(self, block_id: int) -> None:
        """Add one reference (a prefix hit or a fork); a cached block leaves the free queue."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_queue[block_id]
            self.num_cached_blocks -= block.block_hash is not None
        elif block.ref_count == 1:
            self.num_shared_blocks += 1
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        _check(block.ref_count > 0, f"block {block_id} released with ref count {block.ref_count}")
        block.ref_count -= 1
        if block.ref_count == 1:
            self.num_shared_blocks -= 1
        elif block.ref_count == 0:
            self.free_block_queue[block_id] = None
            if block.block_hash is None:
                self.free_block_queue.move_to_end(block_id, last=False)
            else:
                self.num_cached_blocks += 1

    def lookup(self, block_hash: int, key: BlockKey) -> int | None:
        """The cached block with this hash whose K/V were computed from exactly `key`, or None."""
        block_id = self.cached_block_hash_to_block.get(block_hash)
        if block_id is None or self.blocks[block_id].key != key:
            return None
        return block_id

    def parent_ref(self, block_id: int) -> tuple[int, int]:
        """How a child's `BlockKey` names this block as its parent."""
        return block_id, self.blocks[block_id].generation

    def cache_block(self, block_id: int, block_hash: int, key: BlockKey) -> bool:
        """Register a full block under its hash, unless the hash is already taken; True if it was registered.

        A taken hash holds either an equal block (nothing to add) or a collision (this block stays
        uncached: its index entry would have to evict a live one).
        """
        if not self.enable_caching or block_hash in self.cached_block_hash_to_block:
            return False
        block = self.blocks[block_id]
        self.num_cached_blocks += block.ref_count == 0 and block.block_hash is None
        block.block_hash, block.key = block_hash, key
        self.cached_block_hash_to_block[block_hash] = block_id
        if self.events.enabled:
            self.events.emit(BlockCached, block_id=block_id, block_hash=hash_label(block_hash))
        return True

    def uncache(self, block_ids: list[int]) -> None:
        """Take blocks out of the prefix cache (their K/V are not what their hash says): they stay wherever
        their ref count puts them, only unfindable."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            del self.cached_block_hash_to_block[block.block_hash]
            block.block_hash, block.key = None, None
            self.num_cached_blocks -= block.ref_count == 0
        if block_ids and self.events.enabled:
            self.events.emit(CacheReset, block_ids=tuple(block_ids))

    def _evict(self, block: KVBlock) -> None:
        if self.events.enabled:
            self.events.emit(BlockEvicted, block_id=block.block_id, block_hash=hash_label(block.block_hash))
        del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash, block.key = None, None
        self.num_evictions += 1
        self.num_cached_blocks -= 1

    def reset_prefix_cache(self) -> int:
        """Forget every cached block with ref count 0 (blocks in use keep their hash). Returns how many."""
        dropped = []
        for block_id in list(self.free_block_queue):
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self.cached_block_hash_to_block[block.block_hash]
                block.block_hash, block.key = None, None
                self.free_block_queue.move_to_end(block_id, last=False)
                dropped.append(block_id)
        self.num_cached_blocks -= len(dropped)
        if dropped and self.events.enabled:
            self.events.emit(CacheReset, block_ids=tuple(dropped))
        return len(dropped)


class BlockManager:
    """Maps sequences onto the pool: prefix lookup, on-demand allocation, copy-on-write, fork, free."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool, events: EventLog | None = None
    ) -> None:
        self.block_size = block_size
        self.events = events or EventLog()
        self.pool = BlockPool(num_blocks, enable_prefix_caching, self.events)
        self.enable_prefix_caching = enable_prefix_caching
        # Copy-on-write work for the model runner: (src, dst) physical block pairs, drained every step.
        self.pending_copies: list[tuple[int, int]] = []
        self.num_cow_copies = 0
        # Blocks registered for this step before its forward has filled them (`promise_blocks`).
        self.promised: list[tuple[Sequence, int]] = []

    # --- prefix caching -------------------------------------------------------------------------

    def _extra_keys(self, seq: Sequence, block_index: int) -> tuple:
        """What the first block's K/V depend on besides tokens: the cache salt and the adapter's digest
        (its weights, not its name). Later blocks inherit both through the parent hash."""
        request = seq.request
        if block_index != 0:
            return ()
        keys: tuple = ()
        if request.cache_salt is not None:
            keys += (("salt", request.cache_salt),)
        if request.adapter is not None:
            keys += (("lora", request.adapter.digest),)
        return keys

    def _block_tokens(self, seq: Sequence, block_index: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(seq.token_ids[block_index * bs : (block_index + 1) * bs])

    def _block_key(self, seq: Sequence, block_index: int, parent_block: int | None) -> BlockKey:
        parent = None if parent_block is None else self.pool.parent_ref(parent_block)
        return BlockKey(parent, self._block_tokens(seq, block_index), self._extra_keys(seq, block_index))

    def _update_block_hashes(self, seq: Sequence) -> None:
        """Hash every full block of `seq.token_ids` not hashed yet (the hash chain follows the tokens)."""
        bs = self.block_size
        while (len(seq.block_hashes) + 1) * bs <= len(seq.token_ids):
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(hash_block_tokens(parent, self._block_tokens(seq, i), self._extra_keys(seq, i)))

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Physical blocks holding the longest cached block-aligned prefix of a new sequence.

        At most `len(token_ids) - 1` tokens are served from cache: the last token must run through the
        model to produce logits. None for a request that does not read the cache (`Request.reads_prefix_cache`).
        """
        if not self.enable_prefix_caching or not seq.request.reads_prefix_cache:
            return []
        self._update_block_hashes(seq)
        max_blocks = (len(seq.token_ids) - 1) // self.block_size
        hits: list[int] = []
        for i, block_hash in enumerate(seq.block_hashes[:max_blocks]):
            block_id = self.pool.lookup(block_hash, self._block_key(seq, i, hits[-1] if hits else None))
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def prompt_blocks_to_compute(self, seq: Sequence) -> list[int]:
        """Hashes of the full prompt blocks of an admitted `seq` not cached yet, in order: what its prefill is
        computing and will register. Empty without prefix caching."""
        if not self.enable_prefix_caching:
            return []
        self._update_block_hashes(seq)
        return seq.block_hashes[seq.num_cached_blocks : seq.num_prompt_tokens // self.block_size]

    def cache_full_blocks(self, seq: Sequence) -> None:
        """After a step: register blocks that are now full and computed, so later requests can reuse them
        (prompt blocks were mostly promised already, `promise_blocks`; this adds the ones decoding fills)."""
        if not self.enable_prefix_caching:
            return
        self._register_full_blocks(seq, seq.num_computed_tokens)

    def _register_full_blocks(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Register the full blocks of `seq`'s first `num_tokens` tokens not registered yet; the block ids the
        cache took (a hash already taken is skipped: `BlockPool.cache_block`)."""
        self._update_block_hashes(seq)
        num_full = min(num_tokens // self.block_size, len(seq.block_hashes))
        taken = []
        for i in range(seq.num_cached_blocks, num_full):
            key = self._block_key(seq, i, seq.block_table[i - 1] if i else None)
            if self.pool.cache_block(seq.block_table[i], seq.block_hashes[i], key):
                taken.append(seq.block_table[i])
        seq.num_cached_blocks = max(seq.num_cached_blocks, num_full)
        return taken

    def promise_blocks(self, seq: Sequence, num_new_tokens: int) -> None:
        """Register now the blocks that this step's `num_new_tokens` of `seq` fill, before the forward runs,
        so that a sequence admitted later in the same step maps them instead of computing the same K/V again
        (a system prompt that many users send at once: one step for all of them, not one for the first and
        another for the rest). Sound because every layer of the forward writes the whole step's K/V before
        any sequence attends (inference/model.py), so a reader in the same step sees them complete.

        Until the step has run they are promises: `keep_promises` after the forward, `break_promises` if
        it failed (the blocks are then taken out of the cache: their K/V were never written)."""
        if not self.enable_prefix_caching:
            return
        taken = self._register_full_blocks(seq, seq.num_computed_tokens + num_new_tokens)
        self.promised.extend((seq, block_id) for block_id in taken)

    def keep_promises(self) -> None:
        """The step's forward ran: the promised blocks hold their K/V."""
        self.promised = []

    def break_promises(self) -> None:
        """The step's forward failed: unregister the blocks promised for it (each sequence's count of cached
        blocks drops back to before them), so no later request maps K/V that were never written."""
        for seq, block_id in self.promised:
            if block_id in seq.block_table:
                seq.num_cached_blocks = min(seq.num_cached_blocks, seq.block_table.index(block_id))
        self.pool.uncache([block_id for _, block_id in self.promised])
        self.promised = []

    # --- allocation -----------------------------------------------------------------------------

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New physical blocks `allocate` would take: boundary crossings plus a copy-on-write, if any."""
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table)) + int(self._needs_cow(seq))

    def _needs_cow(self, seq: Sequence) -> bool:
        """True when this step would write into a partly filled last block that another table shares."""
        if not seq.block_table or seq.num_computed_tokens % self.block_size == 0:
            return False
        last = seq.num_computed_tokens // self.block_size
        return last < len(seq.block_table) and self.pool.blocks[seq.block_table[last]].ref_count > 1

    def can_admit(self, seq: Sequence, cached_blocks: list[int], num_new_tokens: int) -> bool:
        """Whether a waiting sequence's prefix hits plus its first chunk fit in the pool right now."""
        revived = sum(1 for b in cached_blocks if self.pool.blocks[b].ref_count == 0)
        total = -(-(len(cached_blocks) * self.block_size + num_new_tokens) // self.block_size)
        return total - len(cached_blocks) <= self.pool.num_free_blocks - revived

    def admit(self, seq: Sequence, cached_blocks: list[int]) -> None:
        """Start a waiting sequence's block table from its prefix-cache hits."""
        _check(not seq.block_table, f"seq {seq.seq_id} admitted with a block table")
        for index, block_id in enumerate(cached_blocks):
            self.pool.touch(block_id)
            if self.events.enabled:
                self.events.emit(BlockTouched, request_id=seq.request_id, seq_id=seq.seq_id, index=index,
                                 block_id=block_id, block_hash=hash_label(self.pool.blocks[block_id].block_hash))
        seq.block_table = list(cached_blocks)
        seq.num_cached_blocks = len(cached_blocks)
        seq.num_computed_tokens = len(cached_blocks) * self.block_size

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more tokens of `seq`; False (and no change) if the pool is short.

        Copies-on-write the shared partial last block first, then appends blocks up to
        ceil(context / block_size). The copy itself is queued in `pending_copies` for the model runner.
        """
        if self.num_blocks_needed(seq, num_new_tokens) > self.pool.num_free_blocks:
            return False
        if self._needs_cow(seq):
            last = seq.num_computed_tokens // self.block_size
            src = seq.block_table[last]
            dst = self.pool.get_new_block()
            seq.block_table[last] = dst
            if self.events.enabled:
                self._emit_allocated(seq, last, dst)
                self.events.emit(CopyOnWrite, request_id=seq.request_id, seq_id=seq.seq_id, index=last,
                                 src_block_id=src, dst_block_id=dst)
            # The source keeps this reference until the copy has run (take_pending_copies), so that a
            # preemption later in the same step can never free it and hand it out as another destination.
            self.pending_copies.append((src, dst))
            self.num_cow_copies += 1
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        while len(seq.block_table) < total:
            seq.block_table.append(self.pool.get_new_block())
            if self.events.enabled:
                self._emit_allocated(seq, len(seq.block_table) - 1, seq.block_table[-1])
        return True

    def _emit_allocated(self, seq: Sequence, index: int, block_id: int) -> None:
        self.events.emit(BlockAllocated, request_id=seq.request_id, seq_id=seq.seq_id, index=index,
                         block_id=block_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give `child` the parent's blocks by reference: nothing is copied until one of them writes."""
        for block_id in parent.block_table:
            self.pool.touch(block_id)
        child.block_table = list(parent.block_table)
        if self.events.enabled:
            self.events.emit(Forked, request_id=parent.request_id, parent_seq_id=parent.seq_id,
                             child_seq_id=child.seq_id, block_ids=tuple(parent.block_table))
        child.block_hashes = list(parent.block_hashes)
        child.num_cached_blocks = parent.num_cached_blocks
        child.num_computed_tokens = parent.num_computed_tokens

    def free(self, seq: Sequence, reason: str = "finished") -> None:
        """Drop a sequence's references, last block first so that deeper prefix blocks are evicted first.

        `reason` ("finished", "aborted", "preempted") only labels the emitted event.
        """
        for block_id in reversed(seq.block_table):
            self.pool.release(block_id)
        if seq.block_table and self.events.enabled:
            self.events.emit(BlocksFreed, request_id=seq.request_id, seq_id=seq.seq_id,
                             block_ids=tuple(seq.block_table), reason=reason)
        seq.block_table = []
        seq.num_cached_blocks = 0

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """Hand the step's copy-on-write pairs to the runner and drop the sources' held references."""
        copies, self.pending_copies = self.pending_copies, []
        for src, _ in copies:
            self.pool.release(src)
        return copies

    def reset_prefix_cache(self) -> int:
        """Forget every cached block with ref count 0 (`BlockPool.reset_prefix_cache`); returns how many."""
        return self.pool.reset_prefix_cache()

    # --- figures and checks ---------------------------------------------------------------------

    def view(self, live_seqs: list[Sequence]) -> PoolView:
        """The pool as one `PoolView`: every block's ref count and hash, the tables of `live_seqs` (in their
        order, which orders each block's owners) that hold blocks. O(blocks): not for every step's figures."""
        held = [s for s in live_seqs if s.block_table]
        return PoolView([b.ref_count for b in self.pool.blocks], [hash_label(b.block_hash) for b in self.pool.blocks],
                        {s.seq_id: list(s.block_table) for s in held}, {s.seq_id: s.request_id for s in held})

    @property
    def num_free_blocks(self) -> int:
        """Blocks `allocate` can hand out now (free, or cached and evictable)."""
        return self.pool.num_free_blocks

    def free_queue(self) -> list[int]:
        """Block ids with ref count 0 in the order they are handed out (never-used first, then LRU cached)."""
        return list(self.pool.free_block_queue)

    def stats(self, live_seqs: list[Sequence]) -> dict[str, int | float]:
        """The pool's counters, each O(1) except the slot fill (O(live sequences)): cheap every step."""
        pool = self.pool
        used, cached = pool.num_used_blocks, pool.num_cached_blocks
        return {
            "num_blocks_total": pool.num_blocks,
            "num_blocks_used": used,
            "num_blocks_free": pool.num_blocks - used - cached,
            "num_blocks_cached": cached,
            "num_blocks_shared": pool.num_shared_blocks,
            "kv_cache_usage": used / pool.num_blocks,
            "kv_slot_utilization": self._filled_slots(live_seqs) / (used * self.block_size) if used else 1.0,
            "evictions_total": pool.num_evictions,
            "cow_copies_total": self.num_cow_copies,
        }

    def _filled_slots(self, live_seqs: list[Sequence]) -> int:
        """Slots of the live sequences' blocks that hold computed tokens, each block counted once however
        many sequences share it: every block before a sequence's last computed position is full. Cheap (set
        updates per sequence, not a loop per block), since the bench and the dashboard sample it every step."""
        bs = self.block_size
        full: set[int] = set()
        partial: dict[int, int] = {}
        for seq in live_seqs:
            table, computed = seq.block_table, seq.num_computed_tokens
            num_full = min(len(table), computed // bs)
            full.update(table[:num_full])
            if num_full < len(table) and computed > num_full * bs:
                block_id = table[num_full]
                partial[block_id] = max(partial.get(block_id, 0), computed - num_full * bs)
        return bs * len(full) + sum(tokens for block_id, tokens in partial.items() if block_id not in full)

    def check_integrity(self, live_seqs: list[Sequence]) -> None:
        """Check the DESIGN.md invariants for the pool and the given live (block-holding) sequences.

        Raises `IntegrityError` naming the first broken one.
        """
        pool, bs = self.pool, self.block_size
        holders: dict[int, int] = {}
        for seq in live_seqs:
            expected = -(-seq.num_computed_tokens // bs)
            _check(len(seq.block_table) == expected,
                   f"seq {seq.seq_id}: {len(seq.block_table)} blocks for {seq.num_computed_tokens} tokens")
            _check(len(set(seq.block_table)) == len(seq.block_table), f"seq {seq.seq_id} repeats a block")
            for block_id in seq.block_table:
                holders[block_id] = holders.get(block_id, 0) + 1
        for block in pool.blocks:
            _check(block.ref_count >= 0, f"block {block.block_id} has ref count {block.ref_count}")
            _check(block.ref_count == holders.get(block.block_id, 0),
                   f"block {block.block_id}: ref count {block.ref_count}, held by {holders.get(block.block_id, 0)}")
            in_queue = block.block_id in pool.free_block_queue
            _check(in_queue == (block.ref_count == 0), f"block {block.block_id} queue membership is wrong")
            if block.block_hash is not None:
                _check(pool.cached_block_hash_to_block.get(block.block_hash) == block.block_id,
                       f"hashed block {block.block_id} is not findable by its hash")
                _check(block.key is not None, f"hashed block {block.block_id} has no key")
        for block_hash, block_id in pool.cached_block_hash_to_block.items():
            _check(pool.blocks[block_id].block_hash == block_hash, f"hash index points at block {block_id} wrongly")
        used = sum(1 for b in pool.blocks if b.ref_count > 0)
        _check(used + pool.num_free_blocks == pool.num_blocks,
               f"{used} used + {pool.num_free_blocks} free/cached blocks != {pool.num_blocks} total")
        cached = sum(1 for b in pool.blocks if b.ref_count == 0 and b.block_hash is not None)
        _check(pool.num_cached_blocks == cached, f"cached-block count {pool.num_cached_blocks}, recounted {cached}")
        shared = sum(1 for b in pool.blocks if b.ref_count > 1)
        _check(pool.num_shared_blocks == shared, f"shared-block count {pool.num_shared_blocks}, recounted {shared}")
        _check(not self.pending_copies, "copy-on-write copies left unexecuted")
        _check(not self.promised, "blocks promised to the prefix cache for a step that never ran")
