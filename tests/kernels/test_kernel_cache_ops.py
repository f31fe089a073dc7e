"""reshape_and_cache and copy_blocks: exact writes where asked, nothing anywhere else, on both backends."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_kernels, reference

BACKENDS = ["triton", "torch", "cpu"]


@pytest.fixture(params=BACKENDS)
def ops(request, device):
    if request.param == "triton":
        return request.getfixturevalue("triton_ops")
    if request.param == "cpu":
        if device.type != "cpu" or not cpu_kernels.available():
            pytest.skip("the C++ CPU kernels run on the CPU, when built")
        return cpu_kernels
    return reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reshape_and_cache_writes_only_mapped_slots(ops, device, dtype):
    num_blocks, block_size, kv_heads, head_dim = 6, 8, 3, 64
    key_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    value_cache = key_cache.clone()
    # The engine's K/V are views into a fused QKV projection: token stride larger than heads * head_dim.
    fused = torch.randn(5, 3 * kv_heads * head_dim, dtype=dtype, device=device)
    key = fused[:, :kv_heads * head_dim].view(5, kv_heads, head_dim)
    value = fused[:, kv_heads * head_dim:2 * kv_heads * head_dim].view(5, kv_heads, head_dim)
    slots = torch.tensor([3 * 8 + 7, -1, 0, 5 * 8 + 2, -1], dtype=torch.int64, device=device)

    ops.reshape_and_cache(key, value, key_cache, value_cache, slots)

    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(key_cache[slot // 8, slot % 8], key[token])
            assert torch.equal(value_cache[slot // 8, slot % 8], value[token])
    written = (~key_cache.isnan()).all(-1).all(-1)
    assert written.nonzero().tolist() == [[0, 0], [3, 7], [5, 2]]
    assert torch.equal(written, (~value_cache.isnan()).all(-1).all(-1))
    assert key_cache.isnan().sum() == (num_blocks * block_size - 3) * kv_heads * head_dim


def test_reshape_and_cache_rejects_mismatched_shapes(ops, device):
    cache = torch.zeros(4, 8, 2, 64, device=device)
    key = torch.zeros(3, 2, 64, device=device)
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.reshape_and_cache(key, key, cache, cache.clone(), torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="key/value"):
        ops.reshape_and_cache(key[:, :1], key[:, :1], cache, cache.clone(),
                              torch.zeros(3, dtype=torch.int64, device=device))


def test_reshape_and_cache_refuses_a_slot_outside_the_cache_and_writes_nothing(ops, device):
    if ops not in (reference, cpu_kernels):
        pytest.skip("the Triton kernel trusts the engine's slot mapping (it checks no bounds)")
    cache = torch.zeros(4, 8, 2, 64, device=device)
    key = torch.ones(3, 2, 64, device=device)
    values = cache.clone()
    with pytest.raises(IndexError if ops is reference else (IndexError, RuntimeError)):
        ops.reshape_and_cache(key, key, cache, values, torch.tensor([0, 32, 1], dtype=torch.int64, device=device))
    assert not cache.any() and not values.any()  # both check every slot before writing any
    # The process can still use its device after the refusal (an out-of-range write on CUDA would not).
    assert torch.ones(2, device=device).sum().item() == 2


def test_copy_blocks_copies_every_layer_and_nothing_else(ops, device):
    layers = 3
    key_caches = [torch.randn(7, 16, 2, 64, device=device) for _ in range(layers)]
    value_caches = [torch.randn(7, 16, 2, 64, device=device) for _ in range(layers)]
    before_keys = [c.clone() for c in key_caches]
    before_values = [c.clone() for c in value_caches]
    mapping = torch.tensor([[1, 4], [6, 0], [1, 2]], dtype=torch.int64, device=device)

    ops.copy_blocks(key_caches, value_caches, mapping)

    expected_source = {4: 1, 0: 6, 2: 1}
    for caches, before in ((key_caches, before_keys), (value_caches, before_values)):
        for cache, old in zip(caches, before):
            for block in range(7):
                assert torch.equal(cache[block], old[expected_source.get(block, block)])


@pytest.mark.parametrize(("pairs", "message"), [
    ([[1, 2], [3, 2]], "distinct"),
    ([[1, 2], [2, 3]], "sources"),
    ([[1, 9]], r"\[0, 7\)"),
])
def test_copy_blocks_rejects_unordered_or_out_of_range_mappings(ops, device, pairs, message):
    caches = [torch.zeros(7, 4, 1, 16, device=device)]
    with pytest.raises(ValueError, match=message):
        ops.copy_blocks(caches, [c.clone() for c in caches], torch.tensor(pairs, device=device))


def test_copy_blocks_with_no_pairs_is_a_no_op(ops, device):
    cache = torch.randn(3, 4, 1, 16, device=device)
    before = cache.clone()
    ops.copy_blocks([cache], [cache.clone()], torch.empty(0, 2, dtype=torch.int64, device=device))
    assert torch.equal(cache, before)
