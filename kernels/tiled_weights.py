"""Weight-only int4 and int8 matmuls on CPUs with AMX, AVX-512 BF16 and VNNI: the tiled layouts, their packers,
and the entry points to ``csrc/weight_only_cpu.cpp`` (which says why the layouts are what they are).

An ``[N, K]`` weight is cut into tiles of 16 outputs x 32 inputs, stored output tile by output tile, then input
tile by input tile:

- int4 ``codes`` uint8 ``[N/16, K/32, 4, 16, 4]``: byte (t, kt, b, n, j) holds the codes of output ``16 t + n`` at
  inputs ``32 kt + 8 b + j`` (low nibble) and ``32 kt + 8 b + 4 + j`` (high nibble). ``scales_offsets`` bfloat16
  ``[N/16, K/G, 2, 16]``: per (group, output) the scale ``s`` and the offset ``o = zero - 8 s``, so that
  ``w = code * s + o`` (``kernels.int4_reference``'s values: its ``dequantize_int4`` in bfloat16 is this, rounded).
- int8 ``codes`` uint8 ``[N/16, K/32, 8, 16, 4]``: element (t, kt, j, n, u) is the code of output ``16 t + n`` at
  input ``32 kt + 4 j + u``, plus 128; one scale per output row, applied to the sums.

Activations are bfloat16 ``[M, K]``; ``N`` a multiple of 32 and ``K`` of 32 (``fits``). For a few tokens the
kernel is a GEMV over the codes (the inputs rounded to int8 per 32, as llama.cpp does); more tokens
decode 8 x 32 outputs' weights at a time to bfloat16 tiles and multiply them with AMX. Sums are float32 either way.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from kernels import cpu_kernels

__all__ = ["available", "fits", "pack_int4", "int4_values", "int4_matmul", "pack_int8", "unpack_int8",
           "int8_rows", "int8_matmul"]

TILE_N, TILE_K = 16, 32


@functools.cache
def available() -> bool:
    """Whether the kernels run here: built with AMX and AVX-512 BF16, and the OS grants AMX tile data."""
    return cpu_kernels.available() and cpu_kernels.extension().tiled_weights_available()


def fits(out_features: int, in_features: int) -> bool:
    return out_features % (2 * TILE_N) == 0 and in_features % TILE_K == 0


def _int8_tiles(codes: Tensor) -> Tensor:
    """``[N, K]`` -> the int8 tiles' ``[N/16, K/32, 8, 16, 4]`` order (a view)."""
    n, k = codes.shape
    return codes.view(n // TILE_N, TILE_N, k // TILE_K, 8, 4).permute(0, 2, 3, 1, 4)


def _int4_blocks(codes: Tensor) -> Tensor:
    """``[N, K]`` -> ``[N/16, K/32, 4, 16, 4, 2]``, element (t, kt, b, n, j, h) ``codes[16 t + n, 32 kt + 8 b + 4 h + j]``
    (a view; h picks the nibble)."""
    n, k = codes.shape
    return codes.view(n // TILE_N, TILE_N, k // TILE_K, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)


def pack_int4(codes: Tensor, scales: Tensor, zeros: Tensor) -> tuple[Tensor, Tensor]:
    """Codes uint8 ``[N, K]`` in 0..15 with float32 ``[N, K/G]`` scales and zeros (``w = (code - 8) s + zero``)
    -> the tiled ``codes`` and ``scales_offsets``."""
    nibbles = _int4_blocks(codes.to(torch.uint8))
    packed = (nibbles[..., 0] | (nibbles[..., 1] << 4)).contiguous()
    scale = scales.to(torch.bfloat16)
    offset = zeros.to(torch.bfloat16) - 8 * scale  # rounded as int4_reference.dequantize_int4 rounds it
    n, groups = scales.shape
    so = torch.stack([scale, offset]).view(2, n // TILE_N, TILE_N, groups).permute(1, 3, 0, 2)
    return packed, so.contiguous()


def int4_values(codes: Tensor, scales_offsets: Tensor, group_size: int) -> Tensor:
    """The float32 ``[N, K]`` weight that tiled int4 ``codes`` stand for (``code * s + o``)."""
    t, kt = codes.shape[:2]
    n, k = t * TILE_N, kt * TILE_K
    nibbles = torch.stack([codes & 0xF, codes >> 4], dim=-1)  # [t, kt, b, n, j, h]
    values = nibbles.permute(0, 3, 1, 2, 5, 4).reshape(n, k).float()
    so = scales_offsets.float().permute(2, 0, 3, 1).reshape(2, n, k // group_size, 1)
    return (values.view(n, k // group_size, group_size) * so[0] + so[1]).view(n, k)


def pack_int8(codes: Tensor) -> Tensor:
    """int8 ``[N, K]`` -> the tiled codes (each plus 128, as uint8)."""
    return _int8_tiles(codes.to(torch.int8).view(torch.uint8) ^ 0x80).contiguous()


def _signed(codes: Tensor) -> Tensor:
    return (codes ^ 0x80).view(torch.int8)


def unpack_int8(codes: Tensor) -> Tensor:
    """Tiled int8 codes -> ``[N, K]`` int8."""
    t, kt = codes.shape[:2]
    return _signed(codes.permute(0, 3, 1, 2, 4).reshape(t * TILE_N, kt * TILE_K))


def int8_rows(codes: Tensor, ids: Tensor) -> Tensor:
    """Rows ``ids`` of the ``[N, K]`` int8 weight held tiled (an embedding lookup): ``[len(ids), K]`` int8."""
    picked = codes[ids // TILE_N, :, :, ids % TILE_N]  # [len, K/32, 8, 4]
    return _signed(picked.reshape(ids.shape[0], -1))


def int4_matmul(x: Tensor, codes: Tensor, scales_offsets: Tensor, group_size: int) -> Tensor:
    """``x @ W.T`` for bfloat16 ``x: [M, K]`` and a tiled int4 weight: ``[M, N]`` bfloat16."""
    _check(x, codes)
    return cpu_kernels.extension().tiled_int4_matmul(x.contiguous(), codes, scales_offsets, group_size)


def int8_matmul(x: Tensor, codes: Tensor, scales: Tensor) -> Tensor:
    """``x @ (codes * scales[:, None]).T`` for bfloat16 ``x: [M, K]`` and tiled int8 ``codes``."""
    _check(x, codes)
    return cpu_kernels.extension().tiled_int8_matmul(x.contiguous(), codes, scales)


def _check(x: Tensor, codes: Tensor) -> None:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != codes.shape[1] * TILE_K:
        raise ValueError(f"tiled weights take bfloat16 [M, {codes.shape[1] * TILE_K}] inputs, got "
                         f"{x.dtype} {tuple(x.shape)}")
