"""Quantized `LinearWeight`s (int8 per output row, int4 per group of inputs) and how float weights become them.

Every int4 source (our own quantizer, GGUF Q4_0/Q4_1 blocks, AWQ and GPTQ packs) is first brought into
one device-independent form, `Int4Codes`: codes 0..15 with a float32 scale and zero per (row, group), so
that `w = (code - 8) * scale + zero`. `Int4Weight` then packs those codes for the kernel (`weight_kernel`) the
device and activation dtype will run:

- "tiled": CPU with AMX, bfloat16 activations: our own kernels (`kernels.tiled_weights`), a GEMV reading the
  codes at memory speed for a few tokens and de-quantized tiles through AMX for many (torch's int4 kernel has
  no AMX path and is 4x slower than bfloat16 at 64 tokens: BENCHMARKS.md, issue 14).
- "torch": CPU without AMX, bfloat16 activations: torch's `_weight_int4pack_mm_for_cpu` (codes in its packing).
- "reference": CPU, other dtypes: `kernels.int4_reference` (de-quantise one layer, one dense matmul: the oracle
  path).
- "triton": CUDA: the Triton dequant-GEMM `kernels.int4_triton`.

int8 is symmetric per output row (`w = code * scale`), run on CPU by the tiled kernels or torch's
`_weight_int8pack_mm` for 16-bit activations, and by a de-quantise-then-matmul for float32 (whose
`_weight_int8pack_mm` path is far slower). No path ever keeps a float copy of a weight resident.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference.linear import LinearWeight
from kernels import int4_reference, tiled_weights

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's CPU int4 kernel accepts
Q8_0_BLOCK = 32  # inputs per scale in GGUF's Q8_0


@dataclass
class Int4Codes:
    """A `[N, K]` int4 weight before packing: `w[n, k] = (codes[n, k] - 8) * scales[n, g] + zeros[n, g]`.

    codes uint8 `[N, K]` in 0..15; scales and zeros float32 `[N, K // group_size]`, `g = k // group_size`.
    `input_perm` (GPTQ act-order): the layer computes `x[:, input_perm] @ W.T`, i.e. column j of this
    weight multiplies input `input_perm[j]`.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    input_perm: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """The float32 weight in the input order (act-order undone)."""
        n, k = self.codes.shape
        grouped = self.codes.view(n, k // self.group_size, self.group_size).float() - 8
        w = (grouped * self.scales.unsqueeze(-1) + self.zeros.unsqueeze(-1)).view(n, k)
        if self.input_perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.input_perm] = w
        return out

    @staticmethod
    def cat(parts: list[Int4Codes]) -> Int4Codes:
        """Fuse parts along the output rows (q/k/v, gate/up); they must share group size and input order."""
        first = parts[0]
        for part in parts[1:]:
            if part.group_size != first.group_size:
                raise ValueError(f"fused parts have group sizes {first.group_size} and {part.group_size}")
            same_perm = (part.input_perm is None and first.input_perm is None) or (
                part.input_perm is not None and first.input_perm is not None
                and torch.equal(part.input_perm, first.input_perm))
            if not same_perm:
                raise ValueError("fused parts have different act-order (g_idx) input permutations")
        return Int4Codes(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                         torch.cat([p.zeros for p in parts]), first.group_size, first.input_perm)


def quantize_int4(weight: torch.Tensor, group_size: int) -> Int4Codes:
    """Asymmetric min/max int4 per group of `group_size` inputs (the step is (max - min) / 15)."""
    n, k = weight.shape
    check_group_size(k, group_size)
    groups = weight.float().view(n, k // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scales = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    codes = ((groups - low.unsqueeze(-1)) / scales.unsqueeze(-1)).round().clamp(0, 15)
    # Our zero is the weight value of code 8: low + 8 * scale.
    return Int4Codes(codes.to(torch.uint8).view(n, k), scales, low + 8 * scales, group_size)


def check_group_size(in_features: int, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    if in_features % group_size:
        raise ValueError(f"group size {group_size} does not divide the layer's {in_features} inputs")


def weight_kernel(device: torch.device, dtype: torch.dtype, out_features: int, in_features: int) -> str:
    """Which kernel a quantized weight of this shape runs on: "tiled", "torch", "reference" or "triton"."""
    if device.type == "cuda":
        return "triton"
    if dtype != torch.bfloat16:
        return "reference"
    if tiled_weights.available() and tiled_weights.fits(out_features, in_features):
        return "tiled"
    return "torch"


class Int4Weight(LinearWeight):
    """Group-wise int4 codes packed for this device's kernel (`weight_kernel`), with their scales: tiled
    `scales_offsets` for "tiled", `[K // G, N, 2]` scales and zeros for the others."""

    def __init__(self, codes: Int4Codes, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.codes.shape
        self.group_size = codes.group_size
        self.kernel = weight_kernel(device, dtype, self.out_features, self.in_features)
        if self.kernel == "torch" and self.out_features % 16:
            raise ValueError(f"torch's CPU int4 kernel needs a multiple of 16 output rows, got {self.out_features}")
        if self.kernel == "triton":
            from kernels import int4_triton  # noqa: F401  (fails here, at load, when Triton is missing)
        if self.kernel == "tiled":
            packed, scales = tiled_weights.pack_int4(codes.codes, codes.scales, codes.zeros)
        else:
            packed = (torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.to(torch.int32), 2)
                      if self.kernel == "torch" else int4_reference.pack_codes(codes.codes))
            scales = torch.stack([codes.scales.t(), codes.zeros.t()], dim=-1).contiguous()
        self.register_buffer("packed", packed.to(device))
        self.register_buffer("scales", scales.to(device, dtype))
        perm = codes.input_perm
        self.register_buffer("input_perm", None if perm is None else perm.to(device))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_perm is not None:
            x = x[..., self.input_perm]
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        if self.kernel == "tiled":
            y = tiled_weights.int4_matmul(x, self.packed, self.scales, self.group_size)
        elif self.kernel == "torch":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales)
        elif self.kernel == "triton":
            from kernels import int4_triton

            y = int4_triton.int4_matmul(x, self.packed, self.scales, self.group_size)
        else:
            y = int4_reference.int4_matmul(x, self.packed, self.scales, self.group_size)
        return y.view(*shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        if self.kernel == "tiled":
            w = tiled_weights.int4_values(self.packed, self.scales, self.group_size)
        elif self.kernel == "torch":
            # torch's packing is private to its kernel: read the weight back by multiplying the identity.
            eye = torch.eye(self.in_features, device=self.packed.device)
            w = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size, self.scales.float()).t()
        else:
            w = int4_reference.dequantize_int4(self.packed, self.scales, self.group_size, torch.float32)
        if self.input_perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.input_perm] = w
        return out


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of the last dimension (`w = code * scale`): int8 codes and float32 scales, the
    nearest of 255 levels spanning each row's largest magnitude. Leading dimensions are kept (stacked experts
    `[E, N, K]` give scales `[E, N]`)."""
    weight = weight.float()
    scales = (weight.abs().amax(-1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    codes = (weight / scales.unsqueeze(-1)).round().clamp(-127, 127)
    return codes.to(torch.int8), scales


def quantize_experts(weight: torch.Tensor, method: str, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked experts `[E, N, K]` in the layout `kernels.moe_reference.fused_moe` takes: "int8" gives int8
    codes `[E, N, K]` and scales `[E, N]` (`quantize_int8_rows`); "int4" gives each expert's `quantize_int4`
    codes two a byte, uint8 `[E, N, K / 2]`, and its scales and zeros `[E, K / G, N, 2]` (float32)."""
    if method == "int8":
        return quantize_int8_rows(weight)
    if method != "int4":
        raise ValueError(f"experts quantize to int8 or int4, not {method!r}")
    experts = [quantize_int4(w, group_size) for w in weight]
    packed = torch.stack([int4_reference.pack_codes(e.codes) for e in experts])
    return packed, torch.stack([torch.stack([e.scales.t(), e.zeros.t()], dim=-1) for e in experts])


class Int8Weight(LinearWeight):
    """Symmetric int8: `w[n, k] = codes[n, k] * scales[n]` per output row, the codes tiled for "tiled"; or with
    `group_size`, a scale per row and group of inputs, `scales[n, k // group_size]` (GGUF's Q8_0 blocks, kept
    exactly for float32 activations; de-quantise-then-matmul, the oracle path)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, device: torch.device, dtype: torch.dtype,
                 group_size: int | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.group_size = group_size
        self.kernel = "reference" if group_size else weight_kernel(device, dtype, self.out_features, self.in_features)
        codes = codes.to(torch.int8)
        self.register_buffer("codes", (tiled_weights.pack_int8(codes) if self.kernel == "tiled" else codes).to(device))
        self.register_buffer("scales", scales.to(device, torch.float32 if group_size else dtype))

    @classmethod
    def quantize(cls, weight: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Int8Weight:
        """Round to the nearest of 255 levels spanning each row's largest magnitude."""
        return cls(*quantize_int8_rows(weight), device, dtype)

    @classmethod
    def from_q8_0_values(cls, weight: torch.Tensor, device: torch.device) -> Int8Weight | None:
        """The Q8_0 blocks whose de-quantized values `weight` holds, recovered exactly, or None where they
        cannot be. llama.cpp's quantizer gives the largest magnitude of every 32-input block the code ±127, so
        the block's fp16 scale is that magnitude / 127 (exact: it was 127 × the scale) and each code the value
        / scale. Checked: the codes times the scales must give back `weight` bit for bit."""
        rows, cols = weight.shape
        if cols % Q8_0_BLOCK:
            return None
        blocks = weight.float().view(rows, cols // Q8_0_BLOCK, Q8_0_BLOCK)
        scales = blocks.abs().amax(-1) / 127
        codes = (blocks / scales.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)).round()
        if codes.abs().amax() > 127 or not torch.equal(codes * scales.unsqueeze(-1), blocks):
            return None
        return cls(codes.view(rows, cols), scales, device, torch.float32, group_size=Q8_0_BLOCK)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.group_size:
            return F.linear(x, self.dequantize().to(x.dtype))
        if self.kernel == "tiled":
            y = tiled_weights.int8_matmul(x.reshape(-1, self.in_features), self.codes, self.scales)
        elif x.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features), self.codes, self.scales)
        else:
            # One conversion pass; the per-row scale applies to the output (x @ (q * s).T == (x @ q.T) * s).
            return F.linear(x, self.codes.to(x.dtype)) * self.scales
        return y.view(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        codes = tiled_weights.unpack_int8(self.codes) if self.kernel == "tiled" else self.codes
        return self._scaled(codes.float(), self.scales.float())

    def _scaled(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """`codes` rows times their scales (one per row, or one per row and group)."""
        if not self.group_size:
            return codes * scales.unsqueeze(-1)
        rows = codes.shape[0]
        return (codes.view(rows, -1, self.group_size) * scales.unsqueeze(-1)).view(rows, self.in_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        codes = tiled_weights.int8_rows(self.codes, ids) if self.kernel == "tiled" else self.codes[ids]
        if self.group_size:
            return self._scaled(codes.float(), self.scales[ids])
        return codes.to(self.scales.dtype) * self.scales[ids].unsqueeze(-1)
