"""Greedy output of our engine equals HF transformers token for token (float32, CPU).

The oracle catches most engine bugs: a wrong slot, block table, position, mask or cache write changes
the argmax within a few tokens.
"""

import pytest

from inference import SamplingParams
from tests.inference.engines import get_llm
from tests.inference.oracle_prompts import ORACLE_PROMPTS

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def expected(llm, hf_greedy):
    tok = llm.get_tokenizer()
    return [hf_greedy(tok.encode(p, add_special_tokens=False), MAX_TOKENS) for p in ORACLE_PROMPTS]


def test_prompts_span_lengths(tokenizer):
    lengths = sorted(len(tokenizer.encode(p, add_special_tokens=False)) for p in ORACLE_PROMPTS)
    assert len(ORACLE_PROMPTS) >= 8 and lengths[0] <= 2 and lengths[-1] >= 100


def test_one_at_a_time(hf_greedy):
    llm = get_llm()
    for prompt, want in zip(ORACLE_PROMPTS, expected(llm, hf_greedy)):
        [out] = llm.generate(prompt, GREEDY)
        assert out.outputs[0].token_ids == want, prompt


def test_one_continuous_batch(hf_greedy):
    llm = get_llm()
    outs = llm.generate(ORACLE_PROMPTS, GREEDY)
    assert [o.prompt for o in outs] == ORACLE_PROMPTS
    assert [o.outputs[0].token_ids for o in outs] == expected(llm, hf_greedy)


def test_preemption_keeps_greedy_output(hf_greedy):
    # 24 blocks of 16 slots cannot hold eight prompts plus their outputs at once: sequences must be
    # preempted, recomputed and still produce exactly the same tokens.
    llm = get_llm(num_kv_blocks=24, max_model_len=384, enable_prefix_caching=False)
    before = llm.metrics()["num_preemptions_total"]
    outs = llm.generate(ORACLE_PROMPTS, GREEDY)
    assert llm.metrics()["num_preemptions_total"] > before
    assert [o.outputs[0].token_ids for o in outs] == expected(llm, hf_greedy)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_block_sizes(block_size, hf_greedy):
    llm = get_llm(block_size=block_size, num_kv_blocks=4096 // block_size)
    outs = llm.generate(ORACLE_PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected(llm, hf_greedy)


def test_chunked_prefill_matches(hf_greedy):
    # A token budget of 32 splits every long prompt into chunks that attend to the earlier chunks.
    llm = get_llm(max_num_batched_tokens=32, max_num_seqs=4)
    outs = llm.generate(ORACLE_PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected(llm, hf_greedy)
