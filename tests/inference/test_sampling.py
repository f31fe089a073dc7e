"""Sampler behaviour through the whole engine: seeds, filters, stops, logprobs, n, penalties."""

import math

import pytest
import torch

from inference import SamplingParams
from inference.sampler import _apply_penalties, _sample_random
from inference.sequence import Request
from tests.inference.engines import get_llm

PROMPT = "Write a short poem about autumn leaves."
OTHERS = ["Tell me a joke.", "List three colours:", "What is 2 + 2?"]


def test_seeded_sample_is_reproducible_regardless_of_batch_company():
    llm = get_llm()
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate(PROMPT, params)[0].outputs[0].token_ids
    crowd_params = [SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)] * 3 + [params]
    in_crowd = llm.generate(OTHERS + [PROMPT], crowd_params)[3].outputs[0].token_ids
    assert alone == in_crowd
    other_seed = llm.generate(PROMPT, SamplingParams(temperature=1.0, top_p=0.95, seed=99, max_tokens=16,
                                                     ignore_eos=True))
    assert other_seed[0].outputs[0].token_ids != alone


def test_top_k_one_equals_greedy():
    llm = get_llm()
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].token_ids
    top1 = llm.generate(PROMPT, SamplingParams(temperature=0.8, top_k=1, seed=3, max_tokens=16))
    assert top1[0].outputs[0].token_ids == greedy


def test_stop_string_is_cut_exactly_and_not_emitted():
    llm = get_llm()
    free = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=20))[0].outputs[0]
    assert " 7," in free.text
    cut = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=20, stop=[" 7,", "zzz"]))
    out = cut[0].outputs[0]
    assert out.text == free.text[: free.text.index(" 7,")]
    assert out.finish_reason == "stop" and out.stop_reason == " 7,"
    kept = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=20, stop=" 7,",
                                                      include_stop_str_in_output=True))
    assert kept[0].outputs[0].text == out.text + " 7,"


def test_stop_token_ids_and_max_tokens_and_ignore_eos():
    llm = get_llm()
    tok = llm.get_tokenizer()
    free = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    stop_id = free.token_ids[3]
    out = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_id]))
    assert out[0].outputs[0].token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1]
    assert out[0].outputs[0].finish_reason == "stop" and out[0].outputs[0].stop_reason == stop_id
    assert free.finish_reason == "length" and len(free.token_ids) == 12

    # The chat reply ends with <|im_end|> (eos); ignore_eos runs past it to max_tokens.
    chat = [{"role": "user", "content": "Say hi."}]
    ended = llm.chat(chat, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert ended.finish_reason == "stop" and ended.token_ids[-1] == tok.eos_token_id
    forced = llm.chat(chat, SamplingParams(temperature=0, max_tokens=len(ended.token_ids) + 3, ignore_eos=True))
    assert len(forced[0].outputs[0].token_ids) == len(ended.token_ids) + 3


def test_logprobs_match_hf_log_softmax(hf_model):
    llm = get_llm()
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPT, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=5, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": ids}, params)
    completion = out[0].outputs[0]
    assert len(completion.logprobs) == 6
    full = torch.tensor([ids + completion.token_ids])
    with torch.no_grad():
        ref = hf_model(full).logits[0].float().log_softmax(-1)
    total = 0.0
    for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = ref[len(ids) - 1 + step]
        top_ids = row.topk(5).indices.tolist()
        assert set(top_ids) <= set(entry) and token in entry
        for token_id, value in entry.items():
            assert abs(value - row[token_id].item()) < 1e-4
        total += entry[token]
    assert math.isclose(completion.cumulative_logprob, total, abs_tol=1e-4)


def test_n_samples_differ_and_are_seeded():
    llm = get_llm()
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12)
    first = llm.generate(PROMPT, params)[0]
    again = llm.generate(PROMPT, params)[0]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) > 1


def test_penalties_change_repetitive_output():
    llm = get_llm()
    prompt = "1, 2, 3, 4,"  # greedy continues the count, repeating "," and " " tokens
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].token_ids
    for params in (SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.8),
                   SamplingParams(temperature=0, max_tokens=16, frequency_penalty=2.0)):
        penalised = llm.generate(prompt, params)[0].outputs[0].token_ids
        assert penalised != plain


def test_penalty_arithmetic():
    """Exact vLLM semantics on hand-made logits: repetition divides positive / multiplies negative
    logits of prompt and output tokens; presence and frequency subtract over output tokens only."""
    request = Request("r", None, [0, 1], SamplingParams(temperature=0, repetition_penalty=2.0,
                                                        presence_penalty=0.5, frequency_penalty=0.25),
                      eos_token_id=None)
    seq = request.seqs[0]
    seq.token_ids += [3, 3]  # two output tokens, both id 3
    logits = torch.tensor([[4.0, -4.0, 1.0, 2.0, 0.0]])
    got = _apply_penalties(logits.clone(), [seq])
    want = torch.tensor([[2.0, -8.0, 1.0, 1.0 - 0.5 - 0.5, 0.0]])
    assert torch.allclose(got, want)


def test_min_p_and_top_p_filters_keep_the_most_likely_token():
    llm = get_llm()
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids
    # A near-zero top_p or a min_p of 1 leaves only the argmax token: sampling becomes greedy.
    for params in (SamplingParams(temperature=1.0, top_p=1e-6, seed=5, max_tokens=8),
                   SamplingParams(temperature=1.0, min_p=1.0, seed=5, max_tokens=8)):
        assert llm.generate(PROMPT, params)[0].outputs[0].token_ids == greedy


def _rows(n, **params):
    request = Request("r", None, [0], SamplingParams(**params), eos_token_id=None)
    return [request.seqs[0]] * n


def _reference_filtered(probs, top_k=0, top_p=1.0, min_p=0.0):
    """Brute force: sort the whole vocabulary, apply the three filters, renormalise."""
    sorted_probs, order = probs.sort(descending=True)
    ranks = torch.arange(len(probs))
    keep = (ranks < (top_k or len(probs))) & ((sorted_probs.cumsum(0) - sorted_probs) < top_p)
    keep &= sorted_probs >= min_p * sorted_probs[0]
    out = torch.zeros_like(probs)
    out[order[keep]] = sorted_probs[keep]
    return out / out.sum()


@pytest.mark.parametrize("params", [{}, {"top_k": 2}, {"top_p": 0.7}, {"min_p": 0.4}],
                         ids=["plain", "top_k", "top_p", "min_p"])
@pytest.mark.parametrize("vocab", [6, 1000], ids=["small-vocab", "flat-tail"])
def test_random_sampling_follows_the_filtered_distribution(params, vocab):
    """Frequencies over 20000 draws match the brute-force filtered distribution. With a flat tail holding
    half the mass, plain sampling and top_p=0.7 must leave the 256-candidate shortcut for the full path."""
    probs = torch.zeros(vocab)
    probs[:6] = torch.tensor([0.4, 0.3, 0.2, 0.05, 0.03, 0.02])
    if vocab > 6:
        probs[:6] *= 0.5
        probs[6:] = 0.5 / (vocab - 6)
    torch.manual_seed(0)
    rows = 20000
    logits = probs.log().expand(rows, vocab)
    tokens = _sample_random(logits, _rows(rows, temperature=1.0, **params))
    counts = torch.bincount(tokens, minlength=vocab).float() / rows
    want = _reference_filtered(probs, **params)
    assert set(tokens.unique().tolist()) <= set(want.nonzero().flatten().tolist())
    assert torch.allclose(counts, want, atol=0.015)


BIAS_PROMPT = "The capital of France is"


def test_logit_bias_forces_a_token_in_greedy_and_random_sampling(tokenizer):
    llm = get_llm()
    banana = tokenizer.encode(" banana", add_special_tokens=False)[0]
    for params in (SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logit_bias={banana: 100}),
                   SamplingParams(temperature=1.0, n=2, seed=5, max_tokens=5, ignore_eos=True,
                                  logit_bias={str(banana): 250})):  # a string key (JSON's); clamped to 100
        out = llm.generate(BIAS_PROMPT, params)[0]
        assert [o.token_ids for o in out.outputs] == [[banana] * 5] * params.n


def test_logit_bias_minus_100_gives_hf_second_choice_and_logprobs_stay_raw(hf_model, tokenizer):
    llm = get_llm()
    ids = tokenizer.encode(BIAS_PROMPT, add_special_tokens=False)
    with torch.no_grad():
        row = hf_model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
    first, second = row.topk(2).indices.tolist()
    plain = llm.generate(BIAS_PROMPT, SamplingParams(temperature=0, max_tokens=1, logprobs=1))[0].outputs[0]
    biased = llm.generate(BIAS_PROMPT, SamplingParams(temperature=0, max_tokens=1, logprobs=1,
                                                      logit_bias={first: -100}))[0].outputs[0]
    assert plain.token_ids == [first] and biased.token_ids == [second]
    # vLLM's default logprobs are the raw model's: the bias moves the pick, not the reported logprobs.
    assert biased.logprobs[0][first] == pytest.approx(row[first].item(), abs=2e-4)
    assert biased.logprobs[0][second] == pytest.approx(row[second].item(), abs=2e-4)


def test_logit_bias_in_a_mixed_batch_leaves_the_other_request_alone(tokenizer):
    llm = get_llm()
    banana = tokenizer.encode(" banana", add_special_tokens=False)[0]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    alone = llm.generate(PROMPT, greedy)[0].outputs[0].text
    biased, plain = llm.generate([BIAS_PROMPT, PROMPT], [
        SamplingParams(temperature=0, max_tokens=12, logit_bias={banana: 100}), greedy])
    assert plain.outputs[0].text == alone
    assert biased.outputs[0].token_ids[0] == banana


def test_logit_bias_cannot_leave_a_grammar(tokenizer):
    from inference.sampling_params import StructuredOutputsParams

    llm = get_llm()
    banana = tokenizer.encode(" banana", add_special_tokens=False)[0]
    out = llm.generate(BIAS_PROMPT, SamplingParams(
        temperature=0, max_tokens=8, logit_bias={banana: 100},
        structured_outputs=StructuredOutputsParams(choice=["Paris", "London"])))[0].outputs[0]
    assert out.text in ("Paris", "London")


@pytest.mark.parametrize("bias, why", [
    ([1, 2], "must be a dict"), ({"x": 1.0}, "keys must be"), ({-3: 1.0}, "keys must be"),
    ({True: 1.0}, "keys must be"), ({5: "high"}, "finite numbers"), ({5: float("nan")}, "finite numbers"),
    ({5: float("inf")}, "finite numbers"),
])
def test_logit_bias_bad_values_are_refused(bias, why):
    with pytest.raises(ValueError, match=f"logit_bias.*{why}"):
        SamplingParams(logit_bias=bias)


def test_logit_bias_outside_the_vocabulary_is_refused_and_clamped_inside():
    llm = get_llm()
    vocab = llm.llm_engine.runner.cfg.vocab_size
    with pytest.raises(ValueError, match=r"logit_bias.*out of the vocabulary"):
        llm.generate(BIAS_PROMPT, SamplingParams(max_tokens=1, logit_bias={vocab: 5.0}))
    params = SamplingParams(logit_bias={"7": -1000, 8: 3})
    assert params.logit_bias == {7: -100.0, 8: 3.0}
    assert SamplingParams(logit_bias={}).logit_bias is None
