"""Any local Llama-family HF folder loads: tiny random Llama (untied head) and Qwen2 (q/k/v bias) models
saved by transformers give HF's greedy tokens through our engine."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from inference import LLM, SamplingParams
from tests.inference.tiny_models import SHAPE, save_tiny


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
