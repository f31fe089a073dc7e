"""A mixture-of-experts MLP (Qwen3-MoE, Mixtral, DeepSeek-V2): a router picks `top_k` of `num_experts` SwiGLU
experts for each token, and the layer's output is their outputs weighted by the router (plus, for DeepSeek,
shared experts every token goes through).

Which families have one, where its weights live in the checkpoint and how the router normalises are stated
in `inference/architectures.py` (`MoE`); this module computes it. The computation follows HF transformers'
own, step for step, so that float32 output is bit for bit theirs:

1. router logits `x @ gate.T` in the activations' dtype (DeepSeek: in float32), softmax in float32, the
   `top_k` largest probabilities (softmax then top-k, the order all three use; DeepSeek's group-limited
   top-k first keeps the experts of the `topk_group` groups whose best expert scores highest), renormalised to
   sum to one where the family does (Mixtral always; Qwen3-MoE when `norm_topk_prob`; DeepSeek-V2 never),
   times DeepSeek's `routed_scaling_factor`;
2. the experts, through the backend's fused-MoE (`kernels.fused_moe_for(ops)`): on the CPU (and the torch
   backend) the step's tokens grouped by expert, for each expert some token chose, in ascending expert order,
   one matmul over exactly the tokens that chose it (not one per token), scaled by each token's router weight
   and added into the output (`kernels.moe_reference`; HF's order per token, so float sums round alike); on
   CUDA the Triton fused-MoE kernel (`kernels.moe_triton`: tokens sorted into per-expert blocks, one grouped
   GEMM for gate/up with SiLU-and-mul, one for down, the weighted sum).

The experts are held as two stacked tensors, `[E, 2I, H]` (gate rows then up rows) and `[E, H, I]`, the shape
vLLM's fused-MoE kernels take: float, or with `quantization="int8"` int8 codes with a scale per expert and
output row (`gate_up_scales [E, 2I]`, `down_scales [E, H]`, as `Int8Weight`), or with `quantization="int4"`
each expert's group-wise int4 codes two a byte with their scales and zeros (`kernels.int4_reference`'s
layout); the router stays float. Other quantization methods, LoRA on experts and tensor parallelism over experts are refused at load
(`inference/model.py`, `inference/parallel/ranks.py`), by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from inference.quantization.weights import quantize_experts
from kernels import fused_moe_for, int4_reference, reference
from kernels.moe_reference import int4_group_size

if TYPE_CHECKING:
    from inference.architectures import MoE

TOPK_METHODS = ("greedy", "group_limited_greedy")  # DeepSeek-V2's; V3's "noaux_tc" is not implemented


@dataclass(frozen=True)
class MoEConfig:
    """A checkpoint's mixture of experts, resolved from its config.json (`ModelConfig.moe`)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    normalize: bool  # renormalise the top-k router weights to sum to one
    dense_layers: frozenset[int]  # layers that keep the dense MLP
    router_float32: bool = False  # router logits in float32 whatever the activations (DeepSeek)
    routed_scaling_factor: float = 1.0  # the routed experts' weights are multiplied by this (DeepSeek)
    groups: tuple[int, int] | None = None  # (n_group, topk_group): DeepSeek's group-limited top-k
    shared_intermediate_size: int = 0  # a dense MLP of this size beside the experts (DeepSeek), 0: none

    @classmethod
    def from_config(cls, cfg: dict[str, Any], spec: MoE, where: str) -> MoEConfig:
        """As transformers reads them: Qwen3-MoE keeps a dense MLP in `mlp_only_layers` and layers off every
        `decoder_sparse_step`-th; DeepSeek in its first `first_k_dense_replace` layers. Values this module does
        not implement are refused by name."""
        layers = cfg["num_hidden_layers"]
        step = cfg.get("decoder_sparse_step", 1)
        dense = set(cfg.get("mlp_only_layers") or ()) | {i for i in range(layers) if (i + 1) % step}
        dense |= set(range(cfg.get("first_k_dense_replace", 0)))
        if spec.normalize in ("always", "never"):
            normalize = spec.normalize == "always"
            if cfg.get("norm_topk_prob"):
                raise ValueError(f"{where}: norm_topk_prob=true is not implemented for this family (its router "
                                 f"{'always' if normalize else 'never'} renormalises)")
        else:
            normalize = bool(cfg.get(spec.normalize, False))
        method = cfg.get("topk_method", "greedy")
        if method not in TOPK_METHODS:
            raise ValueError(f"{where}: topk_method={method!r} is not implemented ({', '.join(TOPK_METHODS)})")
        experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
        return cls(
            num_experts=experts,
            top_k=cfg["num_experts_per_tok"],
            intermediate_size=cfg[spec.intermediate_field],
            normalize=normalize,
            dense_layers=frozenset(dense),
            router_float32=spec.router_float32,
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
            groups=(cfg["n_group"], cfg["topk_group"]) if method == "group_limited_greedy" else None,
            shared_intermediate_size=(cfg[spec.intermediate_field] * cfg.get("n_shared_experts", 0)
                                      if spec.shared_experts else 0),
        )


class SparseMoE(nn.Module):
    """One layer's router and experts (each expert `down(silu(gate(x)) * up(x))`), and its shared experts
    (`shared`, a dense MLP added to their output) where the family has them."""

    def __init__(self, hidden_size: int, moe: MoEConfig, shared: nn.Module | None = None) -> None:
        super().__init__()
        self.moe = moe
        self.gate = nn.Parameter(torch.empty(moe.num_experts, hidden_size))
        self.gate_up = nn.Parameter(torch.empty(moe.num_experts, 2 * moe.intermediate_size, hidden_size))
        self.down = nn.Parameter(torch.empty(moe.num_experts, hidden_size, moe.intermediate_size))
        # Quantized experts' scales (kernels.moe_reference): int8 [E, 2I] and [E, H]; int4 with zeros, per group.
        self.register_buffer("gate_up_scales", None)
        self.register_buffer("down_scales", None)
        self.shared = shared

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's `top_k` experts `[T, k]` and their weights `[T, k]` (float32)."""
        moe = self.moe
        logits = F.linear(x.float(), self.gate.float()) if moe.router_float32 else F.linear(x, self.gate)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        if moe.groups is not None:  # only experts of the `topk_group` groups with the best expert compete
            n_group, topk_group = moe.groups
            best = probs.view(-1, n_group, moe.num_experts // n_group).amax(dim=-1)
            keep = torch.zeros_like(best).scatter_(1, torch.topk(best, topk_group, dim=-1)[1], 1.0)
            probs = probs.masked_fill(~keep.repeat_interleave(moe.num_experts // n_group, dim=1).bool(), 0.0)
        weights, experts = torch.topk(probs, moe.top_k, dim=-1)
        if moe.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if moe.routed_scaling_factor != 1.0:
            weights = weights * moe.routed_scaling_factor
        return experts, weights

    def forward(self, x: torch.Tensor, ops: ModuleType = reference) -> torch.Tensor:
        experts, weights = self.route(x)
        out = fused_moe_for(ops)(x, self.gate_up, self.down, experts, weights, self.gate_up_scales, self.down_scales)
        return out if self.shared is None else out + self.shared(x, ops)

    def load(self, gate: torch.Tensor, experts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
             dtype: torch.dtype, device: torch.device, method: str | None = None, group_size: int = 32) -> None:
        """Fill from the router's `[E, H]` weight and each expert's (gate, up, down) weights, in expert order;
        with `method` "int8" or "int4", the experts quantized (`quantize_experts`; the router stays float: it is
        E rows, and every token's routing hangs on it)."""
        if len(experts) != self.moe.num_experts:
            raise ValueError(f"{len(experts)} experts found, the config says {self.moe.num_experts}")
        try:
            gate_up = torch.stack([torch.cat([g, u]) for g, u, _ in experts])
            down = torch.stack([d for _, _, d in experts])
        except RuntimeError as exc:
            raise ValueError(f"the experts' weights differ in shape: {exc}") from None
        for name, value in (("gate", gate), ("gate_up", gate_up), ("down", down)):
            want = getattr(self, name).shape
            if value.shape != want:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(want)}")
            if method is not None and name != "gate":
                value, scales = quantize_experts(value, method, group_size)
                setattr(self, f"{name}_scales", scales.to(device, dtype))
            else:
                value = value.to(dtype)
            setattr(self, name, nn.Parameter(value.to(device), requires_grad=False))

    def expert_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 `gate_up` and `down` values the experts multiply by (quantized ones de-quantized)."""
        return _values(self.gate_up, self.gate_up_scales), _values(self.down, self.down_scales)


def _values(stacked: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    if scales is None:
        return stacked.float()
    if stacked.dtype == torch.int8:
        return stacked.float() * scales.float().unsqueeze(-1)
    group = int4_group_size(stacked, scales)
    return torch.stack([int4_reference.dequantize_int4(w, sz.float(), group, torch.float32)
                        for w, sz in zip(stacked, scales)])
