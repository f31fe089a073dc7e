"""Unpack AWQ and GPTQ 4-bit checkpoints (the layouts AutoAWQ and AutoGPTQ / GPTQModel write) to `Int4Codes`.

For a layer with K inputs, N outputs and groups of G inputs, both store `w[k, n] = (q[k, n] - z[g, n]) * s[g, n]`
with `scales` fp16 `[K/G, N]`, eight 4-bit values per int32:

- AWQ (GEMM): `qweight` `[K, N/8]` and `qzeros` `[K/G, N/8]` packed along outputs in the interleaved order
  0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds output `8c + order[i]`); `g = k // G`.
- GPTQ: `qweight` `[K/8, N]` packed along inputs (nibble j of row r is input `8r + j`), `qzeros` `[K/G, N/8]`
  packed along outputs in order; `g_idx[k]` names each input's group (act-order / desc_act reorders inputs).
  The v1 format stores every zero minus one (`zero_offset` 1), v2 stores it as is.

Our form is `(q - 8) * s + zero`, so `zero = (8 - z) * s`. Act-order becomes an input permutation that makes
each group's inputs consecutive.
"""

from __future__ import annotations

import torch

from inference.quantization.weights import Int4Codes

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ int32 holds output 8c + AWQ_ORDER[i]


def unpack_int32(packed: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 with eight nibbles -> their values, spread along `dim` (8x longer); nibble i lands at order[i]."""
    shifts = torch.tensor([4 * order.index(j) for j in range(8)], dtype=torch.int32)
    moved = packed.to(torch.int32).movedim(dim, -1)
    values = (moved.unsqueeze(-1) >> shifts) & 0xF
    return values.flatten(-2).movedim(-1, dim).to(torch.uint8)


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> Int4Codes:
    codes = unpack_int32(qweight, dim=1, order=AWQ_ORDER)  # [K, N]
    zeros = unpack_int32(qzeros, dim=1, order=AWQ_ORDER)  # [K/G, N]
    _check_shapes(codes, zeros, scales, group_size)
    return _to_codes(codes, zeros.float(), scales.float(), group_size, None)


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                group_size: int, zero_offset: int) -> Int4Codes:
    codes = unpack_int32(qweight, dim=0)  # [K, N]
    zeros = unpack_int32(qzeros, dim=1).float() + zero_offset  # [K/G, N]
    _check_shapes(codes, zeros, scales, group_size)
    k = codes.shape[0]
    in_order = torch.arange(k) // group_size
    if g_idx is None or torch.equal(g_idx.long(), in_order):
        return _to_codes(codes, zeros, scales.float(), group_size, None)
    if g_idx.shape != (k,) or torch.bincount(g_idx.long(), minlength=k // group_size).ne(group_size).any():
        raise ValueError(f"g_idx must give each of the {k // group_size} groups exactly {group_size} inputs")
    perm = torch.argsort(g_idx.long(), stable=True)
    return _to_codes(codes[perm], zeros, scales.float(), group_size, perm)


def _check_shapes(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> None:
    k, n = codes.shape
    if k % group_size:
        raise ValueError(f"group size {group_size} does not divide the layer's {k} inputs")
    if scales.shape != (k // group_size, n) or zeros.shape != (k // group_size, n):
        raise ValueError(f"scales {tuple(scales.shape)} / zeros {tuple(zeros.shape)} do not match a "
                         f"{k}x{n} weight in groups of {group_size} (expected {(k // group_size, n)})")


def _to_codes(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int,
              perm: torch.Tensor | None) -> Int4Codes:
    """`[K, N]` codes with per-group `[K/G, N]` zeros and scales -> our `[N, K]` `(q - 8) * s + zero` form."""
    return Int4Codes(codes.t().contiguous(), scales.t().contiguous(), ((8 - zeros) * scales).t().contiguous(),
                     group_size, perm)
