"""Any local Llama-family HF folder loads: tiny random Llama (untied head) and Qwen2 (q/k/v bias) models
saved by transformers give HF's greedy tokens through our engine."""

import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference import LLM, SamplingParams
from inference.model_loader import DEFAULT_MODEL, resolve_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def save_tiny(folder, model_cls, config):
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # larger weights than the init, so the argmax is decisive
            param.normal_(0, 0.2)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(resolve_model(DEFAULT_MODEL) / name, folder / name)
    return model


@pytest.mark.parametrize("model_cls, config", [
    (LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=False)),
    (Qwen2ForCausalLM, Qwen2Config(**SHAPE, tie_word_embeddings=True)),
], ids=["llama-untied", "qwen2-bias"])
def test_tiny_local_model_matches_hf(tmp_path, model_cls, config):
    hf = save_tiny(tmp_path, model_cls, config)
    llm = LLM(model=str(tmp_path), num_kv_blocks=64, max_model_len=256, dtype="float32")
    tok = llm.get_tokenizer()
    for prompt in ["Hello there", "The quick brown fox jumps over"]:
        ids = tok.encode(prompt, add_special_tokens=False)
        out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert out[0].outputs[0].token_ids == ref
