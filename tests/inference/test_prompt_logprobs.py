"""SamplingParams.prompt_logprobs against the oracle: HF transformers' float32 log-softmax at every prompt
position, with the prefill cut into chunks and with the prompt's prefix already in the cache (which a
prompt-logprobs request must not read, as in vLLM)."""

import pytest
import torch

from inference import Logprob, SamplingParams
from tests.inference.engines import get_llm
from tests.inference.oracle_prompts import ORACLE_PROMPTS

PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening, counting each of the one hundred "
          "and twelve steps, and at the top he wiped the salt from the great lens before lighting the lamp. Ships "
          "passing in the night saw its beam sweep the rocks, and not one of them ran aground in forty years.")
K = 3


def hf_logprobs(hf_model, tokenizer, prompt: str) -> tuple[list[int], torch.Tensor]:
    """The prompt's token ids and HF's log-softmax over the vocabulary at each of its positions."""
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return ids, logits.log_softmax(-1)


@pytest.fixture(scope="module")
def oracle(hf_model, tokenizer):
    return hf_logprobs(hf_model, tokenizer, PROMPT)


def check_against_oracle(prompt_logprobs: list, oracle, k: int = K) -> None:
    ids, expected = oracle
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for t in range(1, len(ids)):
        entry, row = prompt_logprobs[t], expected[t - 1]
        token = ids[t]
        assert isinstance(entry[token], Logprob)
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=2e-4)
        assert entry[token].rank == int((row >= row[token]).sum())
        top_values, top_ids = row.topk(k)
        for r, (tid, value) in enumerate(zip(top_ids.tolist(), top_values.tolist())):
            assert entry[tid].logprob == pytest.approx(value, abs=2e-4)
            assert entry[tid].rank == r + 1
        assert set(entry) == {token, *top_ids.tolist()}
        assert entry[token].decoded_token == get_llm().get_tokenizer().decode([token])


def test_prompt_logprobs_match_hf_with_chunked_prefill(oracle):
    llm = get_llm(max_num_batched_tokens=32, max_num_seqs=4)
    assert len(oracle[0]) > 32  # the prefill takes two chunks, the second attending to the first
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4))[0]
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=K))[0]
    check_against_oracle(out.prompt_logprobs, oracle)
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids  # the extra rows change nothing sampled
    assert plain.prompt_logprobs is None


def test_prompt_logprobs_skip_a_cached_prefix_and_still_fill_the_cache(oracle):
    llm = get_llm()
    llm.reset_prefix_cache()
    llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2))  # the prompt's blocks are now cached
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=K))[0]
    assert out.num_cached_tokens == 0
    check_against_oracle(out.prompt_logprobs, oracle)
    again = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2))[0]
    assert again.num_cached_tokens > 0  # the cache is still read by requests without prompt_logprobs


def test_prompt_logprobs_zero_n_and_a_mixed_batch(oracle):
    llm = get_llm(max_num_batched_tokens=32, max_num_seqs=4)
    params = [SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=0),
              SamplingParams(temperature=0.8, seed=1, n=2, max_tokens=3, prompt_logprobs=1),
              SamplingParams(temperature=0, max_tokens=3)]
    zero, sampled, plain = llm.generate([PROMPT, PROMPT, "Hello there"], params)
    check_against_oracle(zero.prompt_logprobs, oracle, k=0)  # just the prompt token, with its rank
    check_against_oracle(sampled.prompt_logprobs, oracle, k=1)
    assert len(sampled.outputs) == 2 and plain.prompt_logprobs is None
    alone = llm.generate("Hello there", SamplingParams(temperature=0, max_tokens=3))[0]
    assert plain.outputs[0].token_ids == alone.outputs[0].token_ids


def test_prompt_logprobs_survive_preemption_without_repeats(hf_model, tokenizer, hf_greedy):
    # The greedy oracle's preemption pool: sequences are preempted and recomputed; a recomputed chunk must not
    # append its prompt logprobs a second time.
    llm = get_llm(num_kv_blocks=24, max_model_len=384, enable_prefix_caching=False)
    before = llm.metrics()["num_preemptions_total"]
    outs = llm.generate(ORACLE_PROMPTS, SamplingParams(temperature=0, max_tokens=24, prompt_logprobs=1))
    assert llm.metrics()["num_preemptions_total"] > before
    for prompt, out in zip(ORACLE_PROMPTS, outs):
        oracle = hf_logprobs(hf_model, tokenizer, prompt)
        check_against_oracle(out.prompt_logprobs, oracle, k=1)
        assert out.outputs[0].token_ids == hf_greedy(oracle[0], 24)


@pytest.mark.parametrize("value", [-1, 21, 1.5, "2", True])
def test_prompt_logprobs_out_of_range_is_refused(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)
