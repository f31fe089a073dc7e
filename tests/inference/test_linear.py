"""The Linear seam: a fused layer multiplies once and splits into its parts; loads check shapes."""

import pytest
import torch

from inference.linear import FloatWeight, Linear, PackedFloatWeight, VocabEmbedding
from inference.model import load_model
from inference.model_runner import resident_bytes
from inference.quantization.weights import Int8Weight
from tests.inference.tiny_models import SHAPE, save_tiny


def test_fused_layer_equals_its_parts_and_splits_back():
    torch.manual_seed(0)
    q, k = torch.randn(6, 4), torch.randn(2, 4)
    layer = Linear(4, [6, 2], bias=True)
    layer.load(FloatWeight(torch.cat([q, k])), torch.arange(8.0))
    x = torch.randn(3, 4)
    out_q, out_k = layer.split(layer(x))
    torch.testing.assert_close(out_q, x @ q.T + torch.arange(6.0))
    torch.testing.assert_close(out_k, x @ k.T + torch.arange(6.0, 8.0))


def test_load_rejects_a_wrong_shape_or_a_missing_bias():
    layer = Linear(4, [6, 2], bias=True)
    with pytest.raises(ValueError, match=r"\[8, 5\].*needs \[8, 4\]"):
        layer.load(FloatWeight(torch.zeros(8, 5)), torch.zeros(8))
    with pytest.raises(ValueError, match="needs a bias"):
        layer.load(FloatWeight(torch.zeros(8, 4)))


def test_tied_embedding_rows_are_the_lm_head_weight_rows():
    table = torch.randn(10, 4)
    embed, head = VocabEmbedding(10, 4), Linear(4, 10)
    embed.load(FloatWeight(table))
    head.load(embed.weight)
    ids = torch.tensor([3, 0, 9])
    torch.testing.assert_close(embed(ids), table[ids])
    torch.testing.assert_close(head(embed(ids)), table[ids] @ table.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weight_multiplies_like_the_plain_one_and_gives_its_values_back(dtype):
    torch.manual_seed(0)
    value = torch.randn(96, 64).to(dtype)
    plain = FloatWeight(value.clone())
    assert PackedFloatWeight.packs(plain)
    packed = PackedFloatWeight(plain)
    x = torch.randn(5, 64).to(dtype)
    tolerance = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
    torch.testing.assert_close(packed.matmul(x).float(), plain.matmul(x).float(), **tolerance)
    assert torch.equal(packed.dequantize(), value.float())  # exact: the identity times W
    # The packed copy replaces the plain one, it is not beside it (twice the bytes where bfloat16 is widened).
    widened = dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert packed.nbytes == plain.nbytes * (2 if widened else 1)
    with pytest.raises(TypeError, match="packed for"):
        packed.matmul(x.double())


def test_bfloat16_weight_packed_widened_multiplies_in_float32_and_rounds_to_bfloat16():
    # What an AVX2-only CPU gets by default; forced here so every machine checks it.
    torch.manual_seed(0)
    value = torch.randn(96, 64).to(torch.bfloat16)
    packed = PackedFloatWeight(FloatWeight(value.clone()), widen=True)
    assert packed.packed.dtype == torch.float32 and packed.nbytes == value.numel() * 4
    x = torch.randn(5, 64).to(torch.bfloat16)
    y = packed.matmul(x)
    assert y.dtype == torch.bfloat16
    exact = x.double() @ value.double().T  # every bfloat16 product is exact in float32; only the sum rounds
    torch.testing.assert_close(y.double(), exact.to(torch.bfloat16).double(), rtol=8e-3, atol=1e-6)
    assert torch.equal(packed.dequantize(), value.float())


def test_loaded_model_packs_its_linear_layers_and_counts_what_it_keeps(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = save_tiny(tmp_path, LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=True))
    model = load_model(tmp_path, torch.device("cpu"), torch.float32)
    assert isinstance(model.layers[0].self_attn.qkv_proj.weight, PackedFloatWeight)
    assert isinstance(model.layers[0].mlp.down_proj.weight, PackedFloatWeight)
    # The embedding keeps its plain table for row lookups; the tied head multiplies by a packed copy of it.
    assert isinstance(model.embed_tokens.weight, FloatWeight)
    assert torch.equal(model.lm_head.weight.dequantize(), model.embed_tokens.weight.dequantize())
    table = SHAPE["vocab_size"] * SHAPE["hidden_size"] * 4
    assert resident_bytes(model) == sum(p.numel() * 4 for p in hf.parameters()) + table
    assert not PackedFloatWeight.packs(Int8Weight.quantize(torch.randn(8, 4), torch.device("cpu"), torch.float32))
