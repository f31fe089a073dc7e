"""Beam search equals HF transformers' beam search, and beams share blocks instead of copying them."""

import pytest
import torch

from inference import BeamSearchParams
from tests.inference.engines import get_llm

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def add(a, b):"]


def hf_beams(hf_model, token_ids, width, max_tokens, length_penalty, early_stopping):
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                num_beams=width, num_return_sequences=width, do_sample=False,
                                length_penalty=length_penalty, early_stopping=early_stopping)
    eos = hf_model.config.eos_token_id
    beams = []
    for row in out[:, len(token_ids):].tolist():
        beams.append(row[: row.index(eos) + 1] if eos in row else row)  # drop the padding after EOS
    return beams


@pytest.mark.parametrize("length_penalty, early_stopping", [(1.0, False), (0.5, True), (2.0, "never")])
def test_all_beams_equal_hf(hf_model, length_penalty, early_stopping):
    llm = get_llm()
    tok = llm.get_tokenizer()
    params = BeamSearchParams(beam_width=4, max_tokens=12, length_penalty=length_penalty,
                              early_stopping=early_stopping)
    outs = llm.beam_search(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        want = hf_beams(hf_model, tok.encode(prompt, add_special_tokens=False), 4, 12, length_penalty,
                        early_stopping)
        assert [c.token_ids for c in out.outputs] == want, prompt
        assert out.outputs[0].text == tok.decode(want[0], skip_special_tokens=True)
        scores = [c.cumulative_logprob for c in out.outputs]
        assert scores == sorted(scores, reverse=True)


def test_beams_share_prompt_blocks_and_free_dropped_beams():
    llm = get_llm()
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": list(range(1000, 1100))}  # 6 full blocks + 4 tokens
    engine.add_beam_search("beam", prompt, BeamSearchParams(beam_width=4, max_tokens=10, ignore_eos=True))
    peak_used, seen_shared = 0, 0
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
        metrics = engine.metrics()
        peak_used = max(peak_used, metrics["num_blocks_used"])
        seen_shared = max(seen_shared, sum(1 for b in metrics["block_map"] if b["ref_count"] == 4))
    # Four beams of 110 tokens each would need 4 x 7 = 28 blocks unshared; sharing keeps the prompt once.
    assert seen_shared >= 6
    assert peak_used <= 6 + 4 * 2
    assert engine.metrics()["cow_copies_total"] > 0


def test_beam_search_under_preemption_matches(hf_model):
    llm = get_llm(num_kv_blocks=12, max_model_len=192)
    tok = llm.get_tokenizer()
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=4, max_tokens=12))
    for prompt, out in zip(PROMPTS, outs):
        want = hf_beams(hf_model, tok.encode(prompt, add_special_tokens=False), 4, 12, 1.0, False)
        assert [c.token_ids for c in out.outputs] == want


def test_bad_beam_params():
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="early_stopping"):
        BeamSearchParams(beam_width=2, max_tokens=4, early_stopping="sometimes")
