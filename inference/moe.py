"""A mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router picks `top_k` of `num_experts` SwiGLU experts for
each token, and the layer's output is their outputs weighted by the router.

Which families have one, where its weights live in the checkpoint and how the router normalises are stated
in `inference/architectures.py` (`MoE`); this module computes it. The computation follows HF transformers'
own, step for step, so that float32 output is bit for bit theirs:

1. router logits `x @ gate.T` in the activations' dtype, softmax in float32, the `top_k` largest
   probabilities (softmax then top-k, the order both families use), renormalised to sum to one where the
   family does (Mixtral always; Qwen3-MoE when `norm_topk_prob`);
2. the step's tokens grouped by expert: for each expert some token chose, in ascending expert order, one
   matmul over exactly the tokens that chose it (not one per token), scaled by each token's router weight and
   added into the output. Adding in expert order per token is HF's order, so float sums round alike.

The experts are held as two stacked float tensors, `[E, 2I, H]` (gate rows then up rows) and `[E, H, I]`,
the shape vLLM's fused-MoE kernels take. Quantized experts, LoRA on experts and tensor parallelism over
experts are refused at load (`inference/model.py`, `inference/parallel/ranks.py`), by name.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from kernels import reference


class SparseMoE(nn.Module):
    """One layer's router and experts (each expert `down(silu(gate(x)) * up(x))`)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 normalize: bool) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.normalize = num_experts, top_k, normalize
        self.gate = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.gate_up = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's `top_k` experts `[T, k]` and their weights `[T, k]` (float32)."""
        probs = torch.softmax(F.linear(x, self.gate), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights

    def forward(self, x: torch.Tensor, ops: ModuleType = reference) -> torch.Tensor:
        experts, weights = self.route(x)
        out = torch.zeros_like(x)
        # chosen[e, j, t]: token t chose expert e as its j-th pick.
        chosen = F.one_hot(experts, self.num_experts).permute(2, 1, 0)
        for expert in chosen.sum(dim=(1, 2)).nonzero().flatten().tolist():
            pick, tokens = torch.where(chosen[expert])
            h = ops.silu_and_mul(F.linear(x[tokens], self.gate_up[expert]))
            y = F.linear(h, self.down[expert]) * weights[tokens, pick, None]
            out.index_add_(0, tokens, y.to(out.dtype))
        return out

    def load(self, gate: torch.Tensor, experts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
             dtype: torch.dtype, device: torch.device) -> None:
        """Fill from the router's `[E, H]` weight and each expert's (gate, up, down) weights, in expert order."""
        if len(experts) != self.num_experts:
            raise ValueError(f"{len(experts)} experts found, the config says {self.num_experts}")
        try:
            gate_up = torch.stack([torch.cat([g, u]) for g, u, _ in experts])
            down = torch.stack([d for _, _, d in experts])
        except RuntimeError as exc:
            raise ValueError(f"the experts' weights differ in shape: {exc}") from None
        for name, value in (("gate", gate), ("gate_up", gate_up), ("down", down)):
            want = getattr(self, name).shape
            if value.shape != want:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {tuple(want)}")
            setattr(self, name, nn.Parameter(value.to(device, dtype), requires_grad=False))
