"""`python -m bench.block_hashes`: what prefix-cache keying costs the scheduler, per prompt and per step.

Times, in one run and with no model, the block manager's own work for
- a new 2,048-token prompt: hashing its 128 blocks of 16 (and looking each up) on a miss, and the same prompt
  again when every block hits (each hit checks its `BlockKey`);
- one decode step of 64 running sequences: appending a token to each and registering the blocks that filled,
  with prefix caching on and off;
and, for the same prompt, what sha256 over (parent digest, token ids, extra keys) would have cost instead of
Python's `hash()` (the alternative vLLM chose; see inference/block_manager.py for why we check keys instead).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import struct
import timeit

from inference.block_manager import BlockManager
from inference.sampling_params import SamplingParams
from inference.sequence import Request, Sequence

BLOCK_SIZE = 16


def _new_seq(token_ids: list[int], request_id: str) -> Sequence:
    return Request(request_id, None, list(token_ids), SamplingParams(), eos_token_id=None, cache_salt="salt").seqs[0]


def sha256_block_hash(parent: bytes | None, token_ids: tuple[int, ...], extra_keys: tuple = ()) -> bytes:
    """The sha256 alternative, timed for comparison: parent digest, little-endian token ids, extra keys."""
    h = hashlib.sha256(parent or b"")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(repr(extra_keys).encode())
    return h.digest()


def _sha256_chain(token_ids: list[int]) -> None:
    parent = None
    for i in range(len(token_ids) // BLOCK_SIZE):
        parent = sha256_block_hash(parent, tuple(token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]),
                                   ("salt",) if i == 0 else ())


def _python_hash_chain(token_ids: list[int]) -> None:
    parent = None
    for i in range(len(token_ids) // BLOCK_SIZE):
        parent = hash((parent, tuple(token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]), ("salt",) if i == 0 else ()))


def _best_us(fn, number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure(prompt_len: int = 2048, num_decodes: int = 64) -> dict[str, float]:
    rng = random.Random(0)
    prompt = [rng.randrange(49152) for _ in range(prompt_len)]
    bm = BlockManager(num_blocks=4096, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    cached = _new_seq(prompt, "cached")
    bm.allocate(cached, prompt_len)
    cached.num_computed_tokens = prompt_len
    bm.cache_full_blocks(cached)
    other = [rng.randrange(49152) for _ in range(prompt_len)]
    figures = {
        "miss_2048_us": _best_us(lambda: bm.find_cached_prefix(_new_seq(other, "miss")), 20),
        "hit_2048_us": _best_us(lambda: bm.find_cached_prefix(_new_seq(prompt, "hit")), 20),
        "python_hash_chain_2048_us": _best_us(lambda: _python_hash_chain(prompt), 20),
        "sha256_chain_2048_us": _best_us(lambda: _sha256_chain(prompt), 20),
    }
    for caching in (True, False):
        figures[f"decode_step_{num_decodes}_seqs_caching_{'on' if caching else 'off'}_us"] = _decode_step_us(
            BlockManager(num_blocks=4096, block_size=BLOCK_SIZE, enable_prefix_caching=caching), num_decodes, rng)
    return figures


def _decode_step_us(bm: BlockManager, num_decodes: int, rng: random.Random) -> float:
    """The block manager's share of one decode step (allocate, then register newly full blocks) per step."""
    running = []
    for i in range(num_decodes):
        seq = _new_seq([rng.randrange(49152) for _ in range(200 + i)], f"d{i}")
        bm.allocate(seq, len(seq.token_ids))
        seq.num_computed_tokens = len(seq.token_ids)
        bm.cache_full_blocks(seq)
        running.append(seq)

    def decode_step() -> None:
        for seq in running:
            seq.token_ids.append(7)
            bm.allocate(seq, 1)
            seq.num_computed_tokens += 1
            bm.cache_full_blocks(seq)

    return _best_us(decode_step, 16, repeat=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    for name, value in measure().items():
        print(f"{name}: {value:.1f}")


if __name__ == "__main__":
    main()
