"""A model's generation_config.json applied as vLLM applies it: its EOS list adds stop tokens (not under
ignore_eos, nor with generation_config="vllm"), its suggested sampling fills what a request leaves unset
(LLM.generate without sampling params), and a file no request could use fails at load by its path."""

import json

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from inference import LLM, SamplingParams
from tests.inference.tiny_models import SHAPE, save_tiny

PROMPT = "The capital of France is"
OPTIONS = dict(dtype="float32", attention_backend="torch", num_kv_blocks=32, max_model_len=128)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("genconfig")
    save_tiny(folder, LlamaForCausalLM, LlamaConfig(**SHAPE))
    return folder


def with_generation_config(folder, config: dict | None):
    path = folder / "generation_config.json"
    path.unlink(missing_ok=True)
    if config is not None:
        path.write_text(json.dumps(config))
    return folder


def greedy(llm: LLM, **params):
    return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, **params), use_tqdm=False)[0].outputs[0]


def test_eos_list_adds_stop_tokens_as_vllm_does(folder):
    plain = LLM(model=str(with_generation_config(folder, None)), **OPTIONS)
    tokens = greedy(plain).token_ids
    eos = plain.get_tokenizer().eos_token_id
    # the first output token not seen before it and not the tokenizer's EOS: the file's second EOS
    k = next(i for i, t in enumerate(tokens) if i > 0 and t not in tokens[:i] and t != eos)
    listed = LLM(model=str(with_generation_config(folder, {"eos_token_id": [eos, tokens[k]]})), **OPTIONS)
    given = SamplingParams(temperature=0, max_tokens=12)
    out = listed.generate(PROMPT, given, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == tokens[: k + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", tokens[k])
    assert given.stop_token_ids == []  # the caller's params are left as they were
    assert greedy(listed, ignore_eos=True).token_ids == tokens
    ignored = LLM(model=str(folder), generation_config="vllm", **OPTIONS)
    assert greedy(ignored).token_ids == tokens


def test_suggested_sampling_fills_only_unset_params(folder):
    suggested = {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "max_new_tokens": 3, "do_sample": True}
    llm = LLM(model=str(with_generation_config(folder, suggested)), **OPTIONS)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.max_tokens) == (0.7, 5, 0.9, 3)
    assert defaults.repetition_penalty == SamplingParams().repetition_penalty  # not in the file: ours
    assert len(llm.generate(PROMPT, use_tqdm=False)[0].outputs[0].token_ids) == 3
    assert len(greedy(llm).token_ids) == 12  # explicit params are used as given
    other = with_generation_config(folder, None)
    assert LLM(model=str(other), **OPTIONS).get_default_sampling_params() == SamplingParams()


def test_a_generation_config_no_request_could_use_is_refused_by_path(folder, tmp_path):
    with pytest.raises(ValueError, match="generation_config.json"):
        LLM(model=str(with_generation_config(folder, {"top_p": 0.0})), **OPTIONS)
    with pytest.raises(ValueError, match="does not exist"):
        LLM(model=str(with_generation_config(folder, None)), generation_config=str(tmp_path), **OPTIONS)
