"""The mixture-of-experts expert computation in plain torch: the oracle the Triton kernel
(``kernels.moe_triton``) is tested against, and the CPU path itself (``inference.moe.SparseMoE``).

``fused_moe(x [T, H], gate_up [E, 2I, H], down [E, H, I], experts [T, k], weights [T, k]) -> [T, H]``::

    out[t] = sum_j weights[t, j] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])),   e = experts[t, j]

with ``gate[e]`` the first ``I`` rows of ``gate_up[e]`` and ``up[e]`` the last ``I``. The step's tokens are
grouped by expert: for each expert some token chose, in ascending expert order, one matmul over exactly the
tokens that chose it (not one per token), scaled by each token's router weight and added into the output.
Adding in expert order per token is HF transformers' order, so float32 output is bit for bit theirs.

Quantized experts come with their scales, the format told by the codes' dtype:

- int8 (``torch.int8`` codes ``[E, 2I, H]`` and ``[E, H, I]``, ``gate_up_scales [E, 2I]``, ``down_scales [E, H]``):
  symmetric per output row, ``w = code * scale``, as ``inference.quantization.weights.Int8Weight``; each chosen
  expert's matmul runs on its codes and scales the output rows (``x @ (q * s).T == (x @ q.T) * s``);
- int4 (``torch.uint8``, two codes a byte, ``[E, 2I, H / 2]`` and ``[E, H, I / 2]``, scales and zeros
  ``[E, H / G, 2I, 2]`` and ``[E, I / G, H, 2]``): each expert in ``kernels.int4_reference``'s layout,
  ``w = (code - 8) * scale + zero`` per group of ``G`` inputs; each chosen expert is de-quantized, then one
  matmul.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels import int4_reference, reference

__all__ = ["fused_moe", "check_moe_inputs"]


def fused_moe(x: Tensor, gate_up: Tensor, down: Tensor, experts: Tensor, weights: Tensor,
              gate_up_scales: Tensor | None = None, down_scales: Tensor | None = None,
              silu_and_mul: Callable[[Tensor], Tensor] = reference.silu_and_mul) -> Tensor:
    """The routed experts' weighted sum for each token, ``[T, H]`` in ``x``'s dtype (see the module docstring).

    ``silu_and_mul`` is the backend's own (the C++ one on the CPU), so routing a layer through here computes
    what that backend's dense MLP would.
    """
    check_moe_inputs(x, gate_up, down, experts, weights, gate_up_scales, down_scales)
    out = torch.zeros_like(x)
    # chosen[e, j, t]: token t chose expert e as its j-th pick.
    chosen = F.one_hot(experts, gate_up.shape[0]).permute(2, 1, 0)
    for expert in chosen.sum(dim=(1, 2)).nonzero().flatten().tolist():
        pick, tokens = torch.where(chosen[expert])
        h = silu_and_mul(_expert_linear(x[tokens], gate_up, gate_up_scales, expert))
        y = _expert_linear(h, down, down_scales, expert) * weights[tokens, pick, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def _expert_linear(x: Tensor, stacked: Tensor, scales: Tensor | None, expert: int) -> Tensor:
    if scales is None:
        return F.linear(x, stacked[expert])
    if stacked.dtype == torch.uint8:
        return int4_reference.int4_matmul(x, stacked[expert], scales[expert], int4_group_size(stacked, scales))
    return F.linear(x, stacked[expert].to(x.dtype)) * scales[expert]


def in_features(stacked: Tensor) -> int:
    """The inputs of each expert's stacked weight (int4: two a byte)."""
    return stacked.shape[2] * (2 if stacked.dtype == torch.uint8 else 1)


def int4_group_size(stacked: Tensor, scales_zeros: Tensor) -> int:
    """Inputs per scale of int4 experts (their scales and zeros are `[E, K / G, N, 2]`)."""
    return in_features(stacked) // scales_zeros.shape[1]


def check_moe_inputs(x: Tensor, gate_up: Tensor, down: Tensor, experts: Tensor, weights: Tensor,
                     gate_up_scales: Tensor | None, down_scales: Tensor | None) -> None:
    """A ValueError naming the argument whose shape does not fit the others (every backend checks the same)."""
    num_experts, two_i = gate_up.shape[:2]
    hidden = in_features(gate_up)
    fits = {
        "x": x.dim() == 2 and x.shape[1] == hidden,
        "gate_up": gate_up.dim() == 3 and two_i % 2 == 0,
        "down": (down.dtype == gate_up.dtype and down.shape[:2] == (num_experts, hidden)
                 and in_features(down) == two_i // 2),
        "experts": experts.dim() == 2 and experts.shape[0] == x.shape[0],
        "weights": weights.shape == experts.shape,
        "gate_up_scales": _scales_fit(gate_up, gate_up_scales),
        "down_scales": _scales_fit(down, down_scales),
    }
    bad = [name for name, ok in fits.items() if not ok]
    if bad:
        raise ValueError(f"fused_moe: {', '.join(bad)} do not fit gate_up {tuple(gate_up.shape)} (x "
                         f"{tuple(x.shape)}, down {tuple(down.shape)}, experts {tuple(experts.shape)}, weights "
                         f"{tuple(weights.shape)})")


def _scales_fit(stacked: Tensor, scales: Tensor | None) -> bool:
    """Float experts have no scales; int8 one per expert and output row; int4 a scale and zero per group."""
    if stacked.is_floating_point():
        return scales is None
    if scales is None:
        return False
    if stacked.dtype == torch.int8:
        return scales.shape == stacked.shape[:2]
    num_experts, rows = stacked.shape[:2]
    return (scales.dim() == 4 and scales.shape[0] == num_experts and scales.shape[2:] == (rows, 2)
            and in_features(stacked) % scales.shape[1] == 0)
