"""The Linear seam: a fused layer multiplies once and splits into its parts; loads check shapes."""

import pytest
import torch

from inference.linear import FloatWeight, Linear, VocabEmbedding


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
