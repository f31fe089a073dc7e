"""The model's weight matmuls: a `Linear` layer whose weight is stored in a representation it owns.

Every matmul against model weights (q/k/v, o, gate/up, down, lm_head) goes through `Linear.forward`, so
the way a weight is stored (float, or a quantized format from `inference.quantization`) is one object,
`Linear.weight`, that the loader picks and that knows how to multiply by itself. The other hooks live in
`forward` too: a LoRA delta, and for a row-parallel layer under tensor parallelism (o_proj, down_proj) the
all-reduce of the ranks' partial outputs (inference/parallel/layers.py: a column-parallel layer is a plain
`Linear` holding its shard of the rows).

A fused layer (q/k/v, gate/up) is one matmul whose output is the concatenation of its parts;
`output_sizes` says where the parts end, and `split` cuts an output back into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from inference.config import cpu_has_bfloat16

if TYPE_CHECKING:
    from inference.parallel.group import Group


class LinearWeight(nn.Module):
    """A `[out_features, in_features]` weight in some storage format; `matmul(x)` is `x @ W.T`.

    Subclasses keep their tensors as parameters or buffers, so `module.to(dtype)` converts the floating
    ones (scales, zeros) to the activation dtype and leaves integer codes alone.
    """

    out_features: int
    in_features: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        """The weight values this representation multiplies by, as a float32 `[out, in]` tensor."""
        raise NotImplementedError

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight (an embedding lookup when the weight is tied to the embedding)."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes this weight keeps resident (codes, scales and zeros)."""
        return sum(t.numel() * t.element_size() for t in (*self.parameters(), *self.buffers()))


class FloatWeight(LinearWeight):
    """A plain floating-point weight: the default, and the HF-oracle path."""

    def __init__(self, value: torch.Tensor | nn.Parameter) -> None:
        super().__init__()
        self.out_features, self.in_features = value.shape
        self.value = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.value)

    def dequantize(self) -> torch.Tensor:
        return self.value.detach().float()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.value)


class PackedFloatWeight(LinearWeight):
    """A float32 or bfloat16 weight held only in oneDNN's blocked layout, for matmuls on the CPU.

    At decode batch sizes oneDNN with a weight packed once multiplies 1.3-2x faster than `F.linear`, which
    reorders the plain weight on every call (BENCHMARKS.md, issue 12; vLLM's CPU backend packs too). The plain
    copy is dropped, so the weights take the same memory as before. The packed tensor is opaque: it is not a
    parameter (`module.to()` must not touch it), it serves one dtype, and `dequantize` recovers the values
    exactly by multiplying the identity (`I @ W.T` is `W.T`: each output is one weight times 1, plus zeros).

    A bfloat16 weight on a CPU without bfloat16 arithmetic (AVX2 only: oneDNN will not pack it, and torch's
    own bfloat16 matmul there runs 4-8x slower than float32) is packed widened to float32, which holds every
    bfloat16 value exactly: inputs are widened, the product is summed in float32 and rounded to bfloat16, as
    a bfloat16 matmul with float32 accumulation computes it. The price is the weight's memory, twice
    bfloat16's (`nbytes` says so); activations and the KV cache stay bfloat16.
    """

    def __init__(self, weight: FloatWeight, widen: bool | None = None) -> None:
        """`widen`: pack a bfloat16 weight as float32; by default where the CPU has no bfloat16 arithmetic."""
        super().__init__()
        self.out_features, self.in_features = weight.out_features, weight.in_features
        self.dtype = weight.value.dtype  # the activations'
        if widen is None:
            widen = self.dtype == torch.bfloat16 and not cpu_has_bfloat16()
        value = weight.value.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(value.float() if widen else value, None)

    @staticmethod
    def packs(weight: LinearWeight) -> bool:
        """Whether `weight` is a float32 or bfloat16 weight on the CPU, which oneDNN holds packed."""
        return (isinstance(weight, FloatWeight) and weight.value.device.type == "cpu"
                and torch.backends.mkldnn.is_available() and weight.value.dtype in (torch.float32, torch.bfloat16))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            raise TypeError(f"this weight is packed for {self.dtype} inputs, got {x.dtype}")
        # Both casts are no-ops unless the weight is widened (see the class docstring).
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.packed.dtype), self.packed, None, "none", [], "")
        return y.to(x.dtype)

    def dequantize(self) -> torch.Tensor:
        identity = torch.eye(self.in_features, dtype=self.dtype)
        return self.matmul(identity).T.float().contiguous()

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()


class Linear(nn.Module):
    """`y = x @ W.T (+ b)`; the weight's representation is swapped in by `load`, the bias stays float.

    `reduce_group`: a row-parallel layer's ranks. Each holds the weight's columns for its slice of the inputs;
    their partial products are summed before the (replicated) bias is added once.
    """

    def __init__(self, in_features: int, output_sizes: int | list[int], bias: bool = False,
                 reduce_group: Group | None = None) -> None:
        super().__init__()
        self.output_sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        self.in_features, self.out_features = in_features, sum(self.output_sizes)
        self.weight: LinearWeight = FloatWeight(torch.empty(self.out_features, in_features))
        self.bias = nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        self.reduce_group = reduce_group
        # With LoRA enabled, the engine's per-slot adapter delta (inference.lora_slots.LoRALayer).
        self.lora = None

    def load(self, weight: LinearWeight, bias: torch.Tensor | None = None) -> None:
        """Install `weight` (already fused in `output_sizes` order) and, for a biased layer, its bias (on
        the weight's device). Both replace the placeholders, so a model built on the meta device never
        materialises float weights it will not keep."""
        if (weight.out_features, weight.in_features) != (self.out_features, self.in_features):
            raise ValueError(
                f"weight is [{weight.out_features}, {weight.in_features}], "
                f"the layer needs [{self.out_features}, {self.in_features}]"
            )
        if (bias is None) != (self.bias is None):
            raise ValueError("a bias was given for a layer without one, or is missing" if bias is not None
                             else "this layer needs a bias")
        if bias is not None and bias.shape != (self.out_features,):
            raise ValueError(f"bias has shape {tuple(bias.shape)}, the layer needs ({self.out_features},)")
        self.weight = weight
        if bias is not None:
            self.bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight.matmul(x)
        if self.reduce_group is not None:
            y = self.reduce_group.all_reduce(y)
        if self.bias is not None:
            y = y + self.bias
        if self.lora is not None:
            self.lora.add_delta(x, y)
        return y

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Cut a fused layer's output into its parts (q, k, v or gate, up)."""
        return y.split(self.output_sizes, dim=-1)


class VocabEmbedding(nn.Module):
    """Token embedding whose table is a `LinearWeight`, so a tied lm_head shares it in any format."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.weight: LinearWeight = FloatWeight(torch.empty(vocab_size, hidden_size))

    def load(self, weight: LinearWeight) -> None:
        if (weight.out_features, weight.in_features) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"table is [{weight.out_features}, {weight.in_features}], "
                             f"the config says [{self.vocab_size}, {self.hidden_size}]")
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight.rows(ids)
