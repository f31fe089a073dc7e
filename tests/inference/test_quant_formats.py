"""Every weight format round-trips: float -> our packer (or gguf's writer) -> our loader -> weights within
the quantization step of the float weights; and the kernels multiply by exactly the weights they hold."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from inference.quantization.gguf_file import read_gguf
from inference.quantization.packed_int4 import unpack_awq, unpack_gptq
from inference.quantization.weights import Int4Weight, Int8Weight, quantize_int4
from tests.inference.quant_checkpoints import llama_cpp_permute, pack_awq, pack_gptq, tiny_llama, write_gguf

CPU = torch.device("cpu")


def weight(n: int = 64, k: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def group_step(w: torch.Tensor, group: int) -> torch.Tensor:
    """Per element, the int4 step (max - min) / 15 of its group of inputs."""
    g = w.view(w.shape[0], -1, group)
    return ((g.amax(-1) - g.amin(-1)) / 15).repeat_interleave(group, dim=1)


def test_int8_round_trip_is_within_half_a_step_and_both_kernels_use_those_values():
    w = weight()
    q = Int8Weight.quantize(w, CPU, torch.float32)
    step = w.abs().amax(-1, keepdim=True) / 127
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(5, 128)
    torch.testing.assert_close(q.matmul(x), x @ q.dequantize().T)
    q16 = Int8Weight.quantize(w, CPU, torch.bfloat16)  # tiled where the CPU has AMX, else torch's _weight_int8pack_mm
    want = x @ q16.dequantize().T  # (the tiled GEMV rounds each 32 inputs to int8: up to ~1% of the largest output)
    torch.testing.assert_close(q16.matmul(x.bfloat16()).float(), want, rtol=2e-2, atol=1e-2 * want.abs().max().item())
    torch.testing.assert_close(q.rows(torch.tensor([3, 0])), q.dequantize()[[3, 0]])


@pytest.mark.parametrize("group", [32, 64])
def test_int4_round_trip_is_within_half_a_step(group):
    w = weight()
    codes = quantize_int4(w, group)
    assert ((codes.dequantize() - w).abs() <= group_step(w, group) / 2 + 1e-5).all()
    fp32, bf16 = Int4Weight(codes, CPU, torch.float32), Int4Weight(codes, CPU, torch.bfloat16)
    assert fp32.kernel == "reference" and bf16.kernel in ("tiled", "torch")  # tiled where the CPU has AMX
    torch.testing.assert_close(fp32.dequantize(), codes.dequantize(), rtol=0, atol=1e-6)
    x = torch.randn(3, 128)
    torch.testing.assert_close(fp32.matmul(x), x @ codes.dequantize().T, rtol=1e-5, atol=1e-5)
    # bfloat16 scales round the weights a little; the kernel multiplies by what dequantize() reports (the tiled
    # GEMV also rounds each 32 inputs of x to int8: errors up to ~1% of the largest output).
    want = x @ bf16.dequantize().T
    torch.testing.assert_close(bf16.matmul(x.bfloat16()).float(), want, rtol=2e-2, atol=1e-2 * want.abs().max().item())
    # 4 bits of codes + 2 bf16 per group of 32 -> 0.5 + 4/32 bytes per weight.
    assert bf16.nbytes == 64 * 128 // 2 + (128 // group) * 64 * 2 * 2


def test_int4_rejects_a_group_that_does_not_divide_the_layer():
    with pytest.raises(ValueError, match="group size 64 does not divide the layer's 96 inputs"):
        quantize_int4(weight(k=96), 64)


def test_awq_pack_unpacks_to_the_float_weight_within_a_step():
    w = weight(64, 128, seed=1)
    p = pack_awq(w, 32)
    assert p["qweight"].shape == (128, 8) and p["qzeros"].shape == (4, 8) and p["scales"].shape == (4, 64)
    codes = unpack_awq(p["qweight"], p["qzeros"], p["scales"], 32)
    assert ((codes.dequantize() - w).abs() <= group_step(w, 32) * 0.51 + 1e-3).all()


@pytest.mark.parametrize("v1", [True, False], ids=["v1", "v2"])
@pytest.mark.parametrize("desc_act", [False, True], ids=["in-order", "desc_act"])
def test_gptq_pack_unpacks_to_the_float_weight_within_a_step(v1, desc_act):
    w = weight(64, 128, seed=2)
    order = torch.randperm(128, generator=torch.Generator().manual_seed(3)) if desc_act else None
    p = pack_gptq(w, 32, order, v1)
    assert p["qweight"].shape == (16, 64) and p["qzeros"].shape == (4, 8)
    codes = unpack_gptq(p["qweight"], p["qzeros"], p["scales"], p["g_idx"], 32, zero_offset=1 if v1 else 0)
    assert (codes.input_perm is not None) == desc_act
    w_in_groups = w if order is None else w[:, order]
    step = group_step(w_in_groups, 32)
    step = step if order is None else step[:, torch.argsort(order)]
    assert ((codes.dequantize() - w).abs() <= step * 0.51 + 1e-3).all()
    layer = Int4Weight(codes, CPU, torch.float32)  # act-order permutes the input inside matmul
    x = torch.randn(2, 128)
    torch.testing.assert_close(layer.matmul(x), x @ codes.dequantize().T, rtol=1e-4, atol=1e-4)


def test_gptq_rejects_a_g_idx_with_uneven_groups():
    p = pack_gptq(weight(), 32, None, v1=False)
    bad = p["g_idx"].clone()
    bad[0] = 1
    with pytest.raises(ValueError, match="exactly 32 inputs"):
        unpack_gptq(p["qweight"], p["qzeros"], p["scales"], bad, 32, 0)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "F16", "F32"])
def test_gguf_tensors_equal_ggufs_own_dequantization_with_qk_rows_unpermuted(tmp_path, qtype):
    model = tiny_llama(hidden_size=64, intermediate_size=128, vocab_size=256)
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    path = write_gguf(tmp_path / "tiny.gguf", model, kind)
    tensors = read_gguf(path, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2)
    reader = gguf.GGUFReader(str(path))
    raw = {t.name: t for t in reader.tensors}
    for hf_name, gguf_name, heads in [("layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight", 4),
                                      ("layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", 2),
                                      ("layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", None)]:
        value = tensors[hf_name]
        assert hasattr(value, "codes") == qtype.startswith("Q4")  # int4 stays codes, never floats
        got = value.dequantize() if hasattr(value, "codes") else value
        t = raw[gguf_name]
        want = gguf.quants.dequantize(t.data, t.tensor_type).astype("float32").reshape(got.shape)
        in_file_order = got.numpy() if heads is None else llama_cpp_permute(got.numpy(), heads)
        np.testing.assert_allclose(in_file_order, want, rtol=0, atol=1e-6)
        float_w = model.state_dict()["model." + hf_name]  # and it is the float weight, within Q4's step
        assert (got - float_w).abs().max() <= float_w.abs().max() / 7
