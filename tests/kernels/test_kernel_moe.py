"""Fused mixture-of-experts: the torch reference against a per-token float64 sum, the Triton kernel
(interpreted on CPU) against the reference, float and int8 experts; the sort into expert blocks; the dispatch
that sends each backend's MoE layers to its own implementation."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import cpu_kernels, int4_reference, moe_reference, reference


def random_moe(tokens: int, hidden: int, intermediate: int, num_experts: int, top_k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    gate_up = torch.randn(num_experts, 2 * intermediate, hidden, generator=gen) / hidden**0.5
    down = torch.randn(num_experts, hidden, intermediate, generator=gen) / intermediate**0.5
    experts = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(tokens)]).reshape(
        tokens, top_k)
    weights = torch.rand(tokens, top_k, generator=gen)
    return x, gate_up, down, experts, weights


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = w.abs().amax(-1) / 127
    return (w / scales.unsqueeze(-1)).round().to(torch.int8), scales


def int4_groups(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random int4 experts shaped like `w` `[E, N, K]`: packed codes, `[E, K / G, N, 2]` scales and zeros, and
    the float weights they stand for."""
    num_experts, n, k = w.shape
    gen = torch.Generator().manual_seed(n * k + group)
    codes = torch.randint(0, 16, (num_experts, n, k), generator=gen)
    scales_zeros = torch.stack([torch.rand(num_experts, k // group, n, generator=gen) * 0.02 + 0.001,
                                torch.randn(num_experts, k // group, n, generator=gen) * 0.01], dim=-1)
    packed = torch.stack([int4_reference.pack_codes(c) for c in codes])
    values = torch.stack([int4_reference.dequantize_int4(p, sz, group, torch.float32)
                          for p, sz in zip(packed, scales_zeros)])
    return packed, scales_zeros, values


def per_token(x, gate_up, down, experts, weights) -> torch.Tensor:
    """The definition, one token and pick at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(experts[t].tolist(), weights[t].double()):
            gate, up = (gate_up[e].double() @ x[t].double()).chunk(2)
            out[t] += w * (down[e].double() @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("tokens", [1, 9])
def test_reference_is_the_per_token_sum(tokens):
    args = random_moe(tokens, 48, 32, 6, 2)
    torch.testing.assert_close(moe_reference.fused_moe(*args).double(), per_token(*args), rtol=1e-5, atol=1e-5)


def test_reference_int8_experts_are_their_dequantized_weights():
    x, gate_up, down, experts, weights = random_moe(7, 48, 32, 4, 2)
    (gu_codes, gu_scales), (d_codes, d_scales) = int8_rows(gate_up), int8_rows(down)
    out = moe_reference.fused_moe(x, gu_codes, d_codes, experts, weights, gu_scales, d_scales)
    want = per_token(x, gu_codes * gu_scales.unsqueeze(-1), d_codes * d_scales.unsqueeze(-1), experts, weights)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_reference_int4_experts_are_their_dequantized_weights():
    x, gate_up, down, experts, weights = random_moe(7, 64, 32, 4, 2)
    (gu_packed, gu_sz, gu_values), (d_packed, d_sz, d_values) = int4_groups(gate_up, 32), int4_groups(down, 32)
    out = moe_reference.fused_moe(x, gu_packed, d_packed, experts, weights, gu_sz, d_sz)
    torch.testing.assert_close(out.double(), per_token(x, gu_values, d_values, experts, weights), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("block", [16, 4])
def test_align_by_expert_gives_each_block_one_expert_and_every_pair_once(block):
    from kernels import moe_triton

    experts = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [1, 3]])
    sorted_pairs, block_experts = moe_triton.align_by_expert(experts, 5, block)
    pairs = experts.numel()
    assert sorted_pairs.numel() == block_experts.numel() * block
    real = sorted_pairs[sorted_pairs < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # every pair exactly once, padding elsewhere
    for b, expert in enumerate(block_experts.tolist()):
        ids = sorted_pairs[b * block:(b + 1) * block]
        ids = ids[ids < pairs].long()
        if expert < 0:
            assert ids.numel() == 0
        else:
            assert ids.numel() > 0 and (experts.flatten()[ids] == expert).all()
            assert ids.tolist() == sorted(ids.tolist())
    used = (block_experts >= 0).sum().item()  # used blocks first, one partial block per expert at most
    assert (block_experts[:used] >= 0).all() and used == sum(-(-c // block) for c in [2, 2, 1, 5, 0])


@pytest.mark.parametrize("tokens, hidden, intermediate, num_experts, top_k, dtype", [
    (1, 64, 32, 4, 2, torch.float32),  # decode: one token
    (13, 48, 40, 6, 2, torch.float32),  # widths that are no multiple of the tiles
    (140, 32, 64, 2, 1, torch.float32),  # more than 64 pairs per expert on average: the larger blocks
    (9, 64, 32, 8, 3, torch.bfloat16),
])
def test_triton_matches_reference(tokens, hidden, intermediate, num_experts, top_k, dtype, device):
    from kernels import moe_triton

    if device.type == "cpu" and not moe_triton.INTERPRETED:
        pytest.fail("kernels.moe_triton was imported before TRITON_INTERPRET=1 was set")
    x, gate_up, down, experts, weights = (t.to(device) for t in random_moe(tokens, hidden, intermediate,
                                                                           num_experts, top_k))
    x, gate_up, down = x.to(dtype), gate_up.to(dtype), down.to(dtype)
    out = moe_triton.fused_moe(x, gate_up, down, experts, weights)
    want = moe_reference.fused_moe(x.double(), gate_up.double(), down.double(), experts, weights.double())
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_int8_experts_match_reference(dtype, device):
    """Weight-only int8: codes loaded as they are, each output row scaled (scales in the activations' dtype,
    as the engine holds them)."""
    from kernels import moe_triton

    x, gate_up, down, experts, weights = (t.to(device) for t in random_moe(11, 64, 48, 4, 2, seed=3))
    (gu_codes, gu_scales), (d_codes, d_scales) = int8_rows(gate_up), int8_rows(down)
    x, gu_scales, d_scales = x.to(dtype), gu_scales.to(dtype), d_scales.to(dtype)
    out = moe_triton.fused_moe(x, gu_codes, d_codes, experts, weights, gu_scales, d_scales)
    want = moe_reference.fused_moe(x.double(), gu_codes, d_codes, experts, weights.double(), gu_scales.double(),
                                   d_scales.double())
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("tokens, hidden, intermediate, group, dtype", [
    (1, 64, 32, 32, torch.float32), (11, 128, 64, 64, torch.float32), (5, 64, 96, 32, torch.bfloat16)])
def test_triton_int4_experts_match_reference(tokens, hidden, intermediate, group, dtype, device):
    """Weight-only int4: each byte's two codes split in registers, the K step's group scale and zero applied."""
    from kernels import moe_triton

    x, gate_up, down, experts, weights = random_moe(tokens, hidden, intermediate, 4, 2, seed=5)
    (gu_packed, gu_sz, gu_values), (d_packed, d_sz, d_values) = int4_groups(gate_up, group), int4_groups(down, group)
    want = per_token(x.to(dtype), gu_values, d_values, experts, weights)
    x, experts, weights = x.to(dtype).to(device), experts.to(device), weights.to(device)
    out = moe_triton.fused_moe(x, gu_packed.to(device), d_packed.to(device), experts, weights,
                               gu_sz.to(device, dtype), d_sz.to(device, dtype))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    torch.testing.assert_close(out.double().cpu(), want, rtol=tol, atol=tol)


def test_shapes_that_do_not_fit_are_refused_by_name():
    x, gate_up, down, experts, weights = random_moe(3, 32, 16, 4, 2)
    with pytest.raises(ValueError, match="fused_moe: down do not fit"):
        moe_reference.fused_moe(x, gate_up, down[:, :, :8], experts, weights)
    with pytest.raises(ValueError, match="fused_moe: weights do not fit"):
        moe_reference.fused_moe(x, gate_up, down, experts, weights[:, :1])
    with pytest.raises(ValueError, match="fused_moe: gate_up_scales do not fit"):  # float experts take none
        moe_reference.fused_moe(x, gate_up, down, experts, weights, gate_up_scales=torch.ones(4, 32))
    codes, scales = int8_rows(gate_up)
    with pytest.raises(ValueError, match="fused_moe: down do not fit"):  # int8 gate/up, float down
        moe_reference.fused_moe(x, codes, down, experts, weights, scales)


def test_each_backend_gets_its_own_fused_moe(triton_ops):
    """Triton's ops run the kernel; the CPU and torch backends the grouped reference with their silu_and_mul
    (so routing through them leaves CPU numerics as they were)."""
    from kernels import moe_triton

    assert kernels.fused_moe_for(triton_ops) is moe_triton.fused_moe
    for ops in (reference, cpu_kernels):
        fused = kernels.fused_moe_for(ops)
        assert fused.func is moe_reference.fused_moe and fused.keywords == {"silu_and_mul": ops.silu_and_mul}
    args = random_moe(5, 32, 16, 4, 2)
    cpu_ops = cpu_kernels if cpu_kernels.available() else reference
    want = moe_reference.fused_moe(*args, silu_and_mul=cpu_ops.silu_and_mul)
    torch.testing.assert_close(kernels.fused_moe(*args), want, rtol=0, atol=0)


@pytest.mark.parametrize("method", [None, "int8", "int4"], ids=["float", "int8", "int4"])
def test_sparse_moe_runs_the_triton_kernel_on_the_triton_backend(method, triton_ops, device, monkeypatch):
    """The model's MoE layer under the triton backend goes through the fused kernel (not the grouped loop) and
    computes what it computes under the torch backend."""
    from inference.moe import MoEConfig, SparseMoE
    from kernels import moe_triton

    hidden, intermediate, num_experts = 64, 32, 4
    moe = SparseMoE(hidden, MoEConfig(num_experts=num_experts, top_k=2, intermediate_size=intermediate,
                                      normalize=True, dense_layers=frozenset()))
    gen = torch.Generator().manual_seed(4)
    experts = [(torch.randn(intermediate, hidden, generator=gen) * 0.2, torch.randn(intermediate, hidden, generator=gen)
                * 0.2, torch.randn(hidden, intermediate, generator=gen) * 0.2) for _ in range(num_experts)]
    moe.load(torch.randn(num_experts, hidden, generator=gen), experts, torch.float32, device, method)
    x = torch.randn(6, hidden, generator=gen).to(device)
    original, calls = moe_triton.fused_moe, []

    def counting(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(moe_triton, "fused_moe", counting)
    torch.testing.assert_close(moe(x, triton_ops), moe(x, reference), rtol=1e-4, atol=1e-4)
    want_dtype = {None: torch.float32, "int8": torch.int8, "int4": torch.uint8}[method]
    assert len(calls) == 1 and calls[0][1].dtype == want_dtype
