"""Bad input gets a clear error for that request only; the engine keeps serving and loses nothing."""

import pytest

from inference import LLM, ModelNotFoundError, SamplingParams
from tests.inference.engines import get_llm


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"n": 0}, "n"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"logprobs": 100}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": "x"}, "seed"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ],
)
def test_sampling_params_name_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**kwargs)


def test_bad_prompts_fail_without_queueing_anything():
    llm = get_llm(max_model_len=64)
    tok = llm.get_tokenizer()
    too_long = " ".join(["word"] * 200)
    assert len(tok.encode(too_long)) >= 64
    for prompt, message in [(too_long, "max_model_len"), ("", "empty"),
                            ({"prompt_token_ids": [10**9]}, "token ids"), (42, "prompt")]:
        with pytest.raises(ValueError, match=message):
            llm.generate(["A good prompt", prompt], SamplingParams(max_tokens=4))
        assert not llm.llm_engine.has_unfinished_requests()
    # The engine still serves afterwards.
    assert llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4))[0].outputs[0].token_ids


def test_generation_stops_at_max_model_len():
    llm = get_llm(max_model_len=64)
    prompt = {"prompt_token_ids": list(range(1000, 1060))}
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_unknown_model_and_non_llama_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        LLM(model="no-such-model")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelNotFoundError, match="Llama-family"):
        LLM(model=str(tmp_path))
    with pytest.raises(TypeError, match="unknown arguments: bogus"):
        LLM(bogus=1)


def test_pool_smaller_than_one_sequence_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(num_kv_blocks=2, block_size=16, max_model_len=2048)
