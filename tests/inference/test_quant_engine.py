"""Quantized models through the whole engine: with float32 activations our greedy output equals HF
transformers' greedy output on a model holding the same (de-quantized) weight values; the method is read
from the checkpoint; a method, group size or file that does not fit is a clear ValueError."""

from __future__ import annotations

import gguf
import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from inference import LLM, SamplingParams
from tests.inference.oracle_prompts import ORACLE_PROMPTS
from tests.inference.quant_checkpoints import (
    hf_greedy, hf_with_engine_weights, pack_awq, pack_gptq, packed_checkpoint, save_folder, tiny_llama,
    write_gguf,
)

PROMPTS = ["Hello there", "The quick brown fox jumps over"]
TOKENS = 12
SMALL = dict(num_kv_blocks=64, max_model_len=256)


def act_order(k: int) -> torch.Tensor:
    """One permutation per input width, so fused q/k/v (and gate/up) share theirs, as GPTQ's do."""
    return torch.randperm(k, generator=torch.Generator().manual_seed(k))


def awq_folder(path, model, group=32):
    tensors = packed_checkpoint(model, lambda w: pack_awq(w, group))
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return save_folder(path, model, tensors, config)


def gptq_folder(path, model):
    tensors = packed_checkpoint(model, lambda w: pack_gptq(w, 32, act_order(w.shape[1]), v1=True))
    config = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}
    return save_folder(path, model, tensors, config)


def gguf_folder(path, model, linear_type="Q4_1", arch="llama"):
    save_folder(path, model)
    (path / "model.safetensors").unlink()  # the folder's only weights are its GGUF file
    write_gguf(path / "model.gguf", model, getattr(gguf.GGMLQuantizationType, linear_type), arch=arch)
    return path


def assert_matches_hf_on_its_weights(llm: LLM, hf_config) -> None:
    hf = hf_with_engine_weights(llm, hf_config)
    tok = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False)
        [out] = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)
        assert out.outputs[0].token_ids == hf_greedy(hf, ids, TOKENS), prompt


@pytest.mark.parametrize("build, requested, method", [
    (lambda p, m: save_folder(p, m), "int8", "int8"),
    (lambda p, m: save_folder(p, m), "int4", "int4"),
    (awq_folder, None, "awq"),
    (gptq_folder, None, "gptq"),
    (gguf_folder, None, "gguf"),
    (lambda p, m: gguf_folder(p, m, "Q4_0"), "gguf", "gguf"),
], ids=["int8", "int4", "awq-detected", "gptq-v1-desc_act-detected", "gguf-q4_1-detected", "gguf-q4_0"])
def test_quantized_tiny_model_matches_hf_on_the_same_weights(tmp_path, build, requested, method):
    model = tiny_llama()
    folder = build(tmp_path / "model", model)
    llm = LLM(model=str(folder), quantization=requested, dtype="float32", **SMALL)
    assert llm.metrics()["quantization"] == method
    layer = llm.llm_engine.runner.model.layers[1]
    kind = "Int8Weight" if method == "int8" else "Int4Weight"
    assert {type(m.weight).__name__ for m in (layer.self_attn.qkv_proj, layer.mlp.down_proj)} == {kind}
    assert_matches_hf_on_its_weights(llm, model.config)


@pytest.mark.parametrize("config_cls, arch, overrides", [
    (LlamaConfig, "llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 64}}),
    (Qwen3Config, "qwen3", {"head_dim": 32}),
], ids=["llama3", "qwen3"])
def test_llama3_and_qwen3_gguf_match_hf_on_the_same_weights(tmp_path, config_cls, arch, overrides):
    model = tiny_llama(config_cls, **overrides)
    llm = LLM(model=str(gguf_folder(tmp_path / "model", model, arch=arch)), dtype="float32", **SMALL)
    assert llm.metrics()["quantization"] == "gguf"
    assert type(llm.llm_engine.runner.model.layers[0].mlp.down_proj.weight).__name__ == "Int4Weight"
    assert_matches_hf_on_its_weights(llm, model.config)


def test_int4_group_64_and_bfloat16_activations_agree_with_float(tmp_path):
    model = tiny_llama()
    folder = save_folder(tmp_path / "model", model)
    llm = LLM(model=str(folder), quantization="int4", quantization_group_size=64, dtype="bfloat16", **SMALL)
    qkv = llm.llm_engine.runner.model.layers[0].self_attn.qkv_proj.weight
    assert qkv.group_size == 64 and qkv.kernel in ("tiled", "torch")  # a bfloat16 kernel, not the reference
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[1], add_special_tokens=False)
    [out] = llm.generate({"prompt_token_ids": ids},
                         SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=1), use_tqdm=False)
    # Same weight values, only the activations' precision differs (bfloat16; the tiled GEMV also rounds them to
    # int8 per 32 inputs). This random model's top next-token log-probs lie within hundredths of a nat of each
    # other, so the check is on the distribution: our pick is within 0.05 nats of HF's best, and our log-prob
    # of it is HF's to 0.05.
    hf = hf_with_engine_weights(llm, model.config)
    with torch.no_grad():
        hf_lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1].float(), -1)
    token = out.outputs[0].token_ids[0]
    assert hf_lp[token] >= hf_lp.max() - 0.05
    assert abs(out.outputs[0].logprobs[0][token] - hf_lp[token].item()) < 0.05


@pytest.mark.parametrize("requested, match", [
    ("gptq", "is a 'awq' checkpoint; quantization='gptq' does not match"),
    ("int4", "is a 'awq' checkpoint; quantization='int4' does not match"),
    ("bogus", "quantization must be one of"),
])
def test_a_method_that_does_not_match_the_checkpoint_is_refused(tmp_path, requested, match):
    folder = awq_folder(tmp_path / "awq", tiny_llama())
    with pytest.raises(ValueError, match=match):
        LLM(model=str(folder), quantization=requested, **SMALL)


def test_float_checkpoints_refuse_packed_methods_and_bad_group_sizes(tmp_path):
    folder = save_folder(tmp_path / "float", tiny_llama())
    with pytest.raises(ValueError, match="needs a AWQ checkpoint.*no quantization_config"):
        LLM(model=str(folder), quantization="awq", **SMALL)
    with pytest.raises(ValueError, match="needs a .gguf file"):
        LLM(model=str(folder), quantization="gguf", **SMALL)
    with pytest.raises(ValueError, match="group size 32 or 64, got 128"):
        LLM(model=str(folder), quantization="int4", quantization_group_size=128, **SMALL)
    assert LLM(model=str(folder), **SMALL).metrics()["quantization"] == "float32"  # no method: float weights


def test_awq_group_size_that_does_not_divide_a_layer_names_file_and_tensor(tmp_path):
    model = tiny_llama(hidden_size=96, intermediate_size=160)
    folder = awq_folder(tmp_path / "awq", model, group=32)
    config = (folder / "config.json").read_text().replace('"group_size": 32', '"group_size": 64')
    (folder / "config.json").write_text(config)
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'layers.0.mlp.down_proj.qweight' "
                                         r"\(AWQ, group size 64\): group size 64 does not divide the layer's 160"):
        LLM(model=str(folder), **SMALL)


def test_bad_gguf_files_name_the_file_and_the_tensor(tmp_path):
    model = tiny_llama(hidden_size=64, intermediate_size=128)
    good = gguf_folder(tmp_path / "good", model) / "model.gguf"
    data = good.read_bytes()
    cases = {
        "truncated": (data[: len(data) // 2], "not a readable GGUF file, truncated or corrupt"),
        "corrupt": (b"GGXX" + data[4:], "not a readable GGUF file.*magic"),
    }
    for name, (content, match) in cases.items():
        folder = gguf_folder(tmp_path / name, model)
        (folder / "model.gguf").write_bytes(content)
        with pytest.raises(ValueError, match=rf"{name}/model.gguf: {match}"):
            LLM(model=str(folder), **SMALL)
    folder = gguf_folder(tmp_path / "bf16", model, "BF16")
    with pytest.raises(ValueError, match=r"bf16/model.gguf: tensor 'blk.0.attn_q.weight' has type BF16"):
        LLM(model=str(folder), **SMALL)
    folder = save_folder(tmp_path / "gpt2", model)
    (folder / "model.safetensors").unlink()
    write_gguf(folder / "model.gguf", model, gguf.GGMLQuantizationType.Q4_1, arch="gpt2")
    with pytest.raises(ValueError, match=r"gpt2/model.gguf: GGUF architecture 'gpt2' is not supported"):
        LLM(model=str(folder), **SMALL)


@pytest.fixture(scope="module")
def bundled_gguf_float32():
    """SmolLM2's own Q4_1 file (its token table Q8_0) with float32 activations, the oracle path."""
    from inference.model_loader import DEFAULT_MODEL

    with LLM(model=DEFAULT_MODEL, quantization="gguf", dtype="float32", num_kv_blocks=128, max_model_len=512) as llm:
        yield llm


def test_the_bundled_ggufs_weights_are_the_files_own_values_bit_for_bit(bundled_gguf_float32):
    """The Q8_0 token table is kept as the file's blocks (not re-quantized per row, which moved values by up
    to 0.008 and made greedy text depart from HF's on the file), and Q4_1 layers as their codes."""
    from inference.model_loader import DEFAULT_MODEL, find_gguf, resolve_model

    reader = gguf.GGUFReader(find_gguf(DEFAULT_MODEL, resolve_model(DEFAULT_MODEL)))
    files = {t.name: t for t in reader.tensors}

    def file_values(name: str) -> torch.Tensor:
        tensor = files[name]
        return torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type).copy()).float()

    model = bundled_gguf_float32.llm_engine.runner.model
    assert files["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    table = model.embed_tokens.weight
    assert table.group_size == 32 and table.codes.dtype == torch.int8  # 1 byte a value, not a float copy
    assert torch.equal(table.dequantize(), file_values("token_embd.weight"))
    assert torch.equal(table.rows(torch.tensor([0, 9906, 49151])), file_values("token_embd.weight")[[0, 9906, 49151]])
    assert torch.equal(model.layers[3].mlp.down_proj.weight.dequantize(), file_values("blk.3.ffn_down.weight"))
    assert bundled_gguf_float32.metrics()["weight_bytes"] <= 0.3 * 134_515_008 * 4


@pytest.mark.slow
def test_bundled_q4_1_gguf_float32_greedy_equals_hf_loading_the_same_file(bundled_gguf_float32):
    """The must-show: SmolLM2's own GGUF with float32 activations equals HF transformers loading that file
    itself (`gguf_file=`, its de-quantized weights), 32 greedy tokens of each chat."""
    from transformers import AutoModelForCausalLM

    from inference.model_loader import DEFAULT_MODEL, find_gguf, resolve_model

    path = find_gguf(DEFAULT_MODEL, resolve_model(DEFAULT_MODEL))
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    tok = bundled_gguf_float32.get_tokenizer()
    chats = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in ORACLE_PROMPTS]
    prompts = [{"prompt_token_ids": tok.encode(chat, add_special_tokens=False)} for chat in chats]
    outs = bundled_gguf_float32.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
                                         use_tqdm=False)
    for text, prompt, out in zip(ORACLE_PROMPTS, prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt["prompt_token_ids"], 32), text


def test_a_quantized_models_default_dtype_takes_the_fast_kernels_where_the_cpu_has_them(tmp_path):
    """dtype="auto" with quantized weights is bfloat16 on a CPU with bfloat16 arithmetic, whose int4/int8
    kernels are the fast ones (float32 activations run the de-quantise-then-matmul oracle path)."""
    from inference.config import cpu_has_bfloat16

    folder = save_folder(tmp_path / "m", tiny_llama())
    with LLM(model=str(folder), quantization="int4", **SMALL) as llm:
        runner = llm.llm_engine.runner
        fast = cpu_has_bfloat16()
        assert runner.dtype == (torch.bfloat16 if fast else torch.float32)
        kernel = runner.model.layers[0].mlp.down_proj.weight.kernel
        assert (kernel in ("tiled", "torch")) if fast else kernel == "reference"
    with LLM(model=str(folder), **SMALL) as float_weights:
        assert float_weights.llm_engine.runner.dtype == torch.float32  # the oracle mode stays the default
