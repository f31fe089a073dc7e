"""The batched LoRA delta: Triton (interpreted on CPU) and the torch reference against a float64 dense
per-row computation; base-model rows (slot -1) and rank-0 slots are left bit-for-bit untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.lora import LoRAIndex, reference_add_lora

IN, OUT, SLOTS, MAX_RANK = 96, 80, 3, 16
# (slot or None, rows): base rows between and around adapters; slot 2 in two separate runs.
SEGMENTS = [(None, 3), (2, 4), (0, 1), (None, 2), (2, 1), (1, 2), (0, 5)]
RANKS = [8, 0, 16]  # slot 1 does not adapt this layer


@pytest.fixture(params=["triton", "torch"])
def add_lora(request, triton_ops):
    if request.param == "torch":
        return reference_add_lora
    from kernels.lora_triton import add_lora

    return add_lora


def stacks(dtype, device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(SLOTS, MAX_RANK, IN, generator=g)
    b = torch.randn(SLOTS, OUT, MAX_RANK, generator=g)
    for slot, r in enumerate(RANKS):  # padding past the rank is zero, as the engine loads it
        a[slot, r:] = 0
        b[slot, :, r:] = 0
    b[1] = 5.0  # a rank-0 slot's stale values must never be read
    return a.to(dtype).to(device), b.to(dtype).to(device)


def dense_expected(y, x, a, b, segments):
    out = y.double().clone()
    row = 0
    for slot, count in segments:
        for t in range(row, row + count):
            if slot is not None and RANKS[slot]:
                r = RANKS[slot]
                out[t] += (x[t].double() @ a[slot, :r].double().T) @ b[slot, :, :r].double().T
        row += count
    return out


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-3), (torch.bfloat16, 0.5)])
def test_delta_per_row_adapter_and_base_rows_untouched(add_lora, device, dtype, atol):
    num_tokens = sum(c for _, c in SEGMENTS)
    index = LoRAIndex.build(SEGMENTS, device)
    a, b = stacks(dtype, device)
    x = torch.randn(num_tokens, IN, dtype=dtype, device=device)
    base_rows = (index.token_slots < 0).cpu()
    x[base_rows.to(device)] = float("nan")  # a base row is never read
    # y is the middle column slice of a fused output, as q/k/v and gate/up are.
    fused = torch.randn(num_tokens, OUT + 48, dtype=dtype, device=device)
    y = fused[:, 16:16 + OUT]
    before = fused.clone()
    ranks = torch.tensor(RANKS, dtype=torch.int32, device=device)

    add_lora(y, x, a, b, ranks, index)

    want = dense_expected(before[:, 16:16 + OUT], x, a, b, SEGMENTS)
    assert torch.equal(fused[:, :16], before[:, :16]) and torch.equal(fused[:, 16 + OUT:], before[:, 16 + OUT:])
    assert torch.equal(fused[base_rows.to(device)], before[base_rows.to(device)])
    rank0 = (index.token_slots == 1).to(device)
    assert torch.equal(fused[rank0], before[rank0])
    adapted = ~base_rows.to(device) & ~rank0
    assert torch.isfinite(y[adapted]).all()
    torch.testing.assert_close(y[adapted].double(), want[adapted], atol=atol * 8, rtol=2e-2)


def test_index_groups_contiguous_rows_as_slices():
    index = LoRAIndex.build([(None, 2), (1, 3), (1, 2), (0, 1), (1, 1)], "cpu")
    assert index.token_slots.tolist() == [-1, -1, 1, 1, 1, 1, 1, 0, 1]
    groups = dict(index.groups)
    assert groups[0] == slice(7, 8)
    assert groups[1].tolist() == [2, 3, 4, 5, 6, 8]
    assert LoRAIndex.build([(None, 4)], "cpu").groups == ()


def test_shapes_are_checked(add_lora, device):
    a, b = stacks(torch.float32, device)
    index = LoRAIndex.build([(0, 2)], device)
    ranks = torch.tensor(RANKS, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="x must be"):
        add_lora(torch.zeros(2, OUT, device=device), torch.zeros(3, IN, device=device), a, b, ranks, index)
    with pytest.raises(ValueError, match="ranks must be"):
        add_lora(torch.zeros(2, OUT, device=device), torch.zeros(2, IN, device=device), a, b, ranks[:2], index)


COMPILE = """
import sys
from kernels import lora_triton as lt
from tests.kernels.compile_for_hopper import compile_kernel
for dtype in ("fp32", "bf16"):
    for block_r in (16, 64, 128):
        compile_kernel(lt._shrink_kernel, dict(x_ptr=dtype, a_ptr=dtype, slots_ptr="i32", ranks_ptr="i32",
                       buf_ptr="fp32"), dict(BLOCK_R=block_r, BLOCK_K=lt.BLOCK_K))
        compile_kernel(lt._expand_kernel, dict(buf_ptr="fp32", b_ptr=dtype, slots_ptr="i32", ranks_ptr="i32",
                       y_ptr=dtype), dict(BLOCK_R=block_r, BLOCK_N=lt.BLOCK_N))
    print("compiled", dtype)
"""


def test_lora_kernels_compile_for_hopper():
    """The interpreter skips the compiler's rules; compiling for sm_90 (no GPU needed) checks them."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.split() == ["compiled", "fp32", "compiled", "bf16"]
