"""vLLM's extra fields change the output as vLLM's do, on the real model (greedy, few tokens), through the
worker's EngineService and the request envelope: min_tokens, ignore_eos, stop_token_ids,
include_stop_str_in_output, skip_special_tokens, truncate_prompt_tokens, add_generation_prompt,
continue_final_message, chat_template_kwargs, top_k, min_p, repetition_penalty, seed, logit_bias and
prompt_logprobs."""
import pytest

from inference.llm import encode_chat
from playground.serving.shared.envelope import Job
from playground.serving.worker.engine_service import EngineService

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Say hi."}]
GREEDY = {"n": 1, "temperature": 0.0, "max_tokens": 64}


@pytest.fixture(scope="module")
def service():
    service = EngineService({"model": MODEL, "device": "cpu", "max_model_len": 256, "num_kv_blocks": 64})
    service.load()
    yield service
    service.shutdown()


def run(service: EngineService, job: Job) -> tuple[dict, list[int]]:
    """The `done` payload and the first output's token ids."""
    stream = service.submit(f"t{id(job)}", job)
    while stream.get(timeout=120) is not None:
        pass
    return service.result(stream), stream.final.outputs[0].token_ids


def chat(service, messages=ASK, **fields) -> tuple[dict, list[int]]:
    params = {**GREEDY, **{k: v for k, v in fields.items() if k not in Job.__dataclass_fields__}}
    options = {k: v for k, v in fields.items() if k in Job.__dataclass_fields__}
    return run(service, Job(params, messages, **options))


def test_min_tokens_ignore_eos_and_stop_token_ids(service):
    done, ids = chat(service)
    natural = done["usage"]["completion_tokens"]
    assert natural < 56  # the reply ends on its own
    longer, _ = chat(service, min_tokens=natural + 3)
    assert longer["usage"]["completion_tokens"] >= natural + 3
    forced, _ = chat(service, ignore_eos=True, max_tokens=natural + 6)
    assert forced["usage"]["completion_tokens"] == natural + 6 and forced["outputs"][0]["finish_reason"] == "length"
    stopped, stop_ids = chat(service, stop_token_ids=[ids[1]])
    assert stop_ids == ids[:2] and stopped["outputs"][0]["finish_reason"] == "stop"


def test_include_stop_str_and_skip_special_tokens(service):
    done, _ = chat(service)
    text = done["outputs"][0]["text"]
    word = text.split()[1]
    without, _ = chat(service, stop=[word])
    with_stop, _ = chat(service, stop=[word], include_stop_str_in_output=True)
    assert without["outputs"][0]["text"] == text[: text.index(word)]
    assert with_stop["outputs"][0]["text"] == text[: text.index(word) + len(word)]
    shown, _ = chat(service, ignore_eos=True, skip_special_tokens=False)
    hidden, _ = chat(service, ignore_eos=True)
    assert "<|im_end|>" in shown["outputs"][0]["text"] and "<|im_end|>" not in hidden["outputs"][0]["text"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(service):
    full, _ = run(service, Job(GREEDY, prompt="one two three four five six seven eight nine ten"))
    cut, _ = run(service, Job(GREEDY, prompt="one two three four five six seven eight nine ten",
                              truncate_prompt_tokens=3))
    ids, _ = run(service, Job(GREEDY, prompt=[1, 2, 3, 4, 5, 6], truncate_prompt_tokens=2))
    assert full["usage"]["prompt_tokens"] > 3 and cut["usage"]["prompt_tokens"] == 3
    assert ids["usage"]["prompt_tokens"] == 2


def test_generation_prompt_and_continuing_the_final_message(service):
    engine = service.wait_ready(0)
    with_prompt, _ = chat(service, max_tokens=1)
    without, _ = chat(service, max_tokens=1, add_generation_prompt=False)
    assert with_prompt["usage"]["prompt_tokens"] == len(engine.encode_chat(ASK))
    assert without["usage"]["prompt_tokens"] == len(engine.encode_chat(ASK, add_generation_prompt=False)) < \
        with_prompt["usage"]["prompt_tokens"]
    prefill = [*ASK, {"role": "assistant", "content": "Hi! My name"}]
    continued, _ = chat(service, prefill, add_generation_prompt=False, continue_final_message=True, max_tokens=4)
    ids = engine.encode_chat(prefill, add_generation_prompt=False, continue_final_message=True)
    assert continued["usage"]["prompt_tokens"] == len(ids)
    assert ids[-len(engine.encode(" name")):] == engine.encode(" name")  # the turn is left open, no <|im_end|>
    assert continued["outputs"][0]["text"].startswith(" is")  # the reply goes on from "My name"


def test_chat_template_kwargs_reach_the_template(service):
    tokenizer = service.wait_ready(0).tokenizer
    custom = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    template, tokenizer.chat_template = tokenizer.chat_template, custom
    try:
        assert tokenizer.decode(encode_chat(tokenizer, ASK, greeting="Ahoy ")) == "Ahoy Say hi."
    finally:
        tokenizer.chat_template = template


def test_sampling_extras_change_the_output(service):
    greedy, _ = chat(service, max_tokens=12)
    sampled = {"temperature": 1.5, "max_tokens": 12}
    assert chat(service, top_k=1, seed=1, **sampled)[0]["outputs"] == greedy["outputs"]  # top_k=1 is greedy
    assert chat(service, min_p=1.0, seed=2, **sampled)[0]["outputs"] == greedy["outputs"]  # so is min_p=1
    first, second = (chat(service, seed=9, **sampled)[0]["outputs"] for _ in range(2))
    assert first == second  # a seed makes sampling repeatable
    cats = [{"role": "user", "content": "Write the word cat ten times: cat cat cat"}]
    penalised, _ = chat(service, cats, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)
    plain, _ = chat(service, cats, max_tokens=12, ignore_eos=True)
    assert penalised["outputs"][0]["text"] != plain["outputs"][0]["text"]


def test_tokenize_and_detokenize_jobs_use_the_generations_tokenizer(service):
    """/tokenize and /detokenize as the worker answers them: a chat's count is the chat completion's prompt
    tokens; the token strings are the tokenizer's; detokenizing gives the text back; an id past the vocabulary
    is refused naming `tokens`. The HF tokenizer is the oracle."""
    tokenizer = service.wait_ready(0).tokenizer
    chatted = service.tokenize(Job({}, ASK, kind="tokenize", return_token_strs=True))
    done, _ = chat(service, max_tokens=1)
    assert chatted["count"] == len(chatted["tokens"]) == done["usage"]["prompt_tokens"]
    assert chatted["token_strs"] == tokenizer.convert_ids_to_tokens(chatted["tokens"])
    assert chatted["max_model_len"] == 256
    prefill = [*ASK, {"role": "assistant", "content": "Hi! My name"}]
    continued = service.tokenize(Job({}, prefill, kind="tokenize", add_generation_prompt=False,
                                     continue_final_message=True))
    assert continued["tokens"] == encode_chat(tokenizer, prefill, add_generation_prompt=False,
                                              continue_final_message=True)
    text = "Hello world, héllo wörld!"
    plain = service.tokenize(Job({}, prompt=text, kind="tokenize", add_special_tokens=True))
    assert plain["tokens"] == tokenizer.encode(text, add_special_tokens=True) and plain["token_strs"] is None
    completion, _ = run(service, Job({**GREEDY, "max_tokens": 1}, prompt=text))
    assert completion["usage"]["prompt_tokens"] == len(tokenizer.encode(text, add_special_tokens=False))
    assert service.tokenize(Job({}, prompt=plain["tokens"], kind="detokenize")) == {"prompt": text}
    with pytest.raises(ValueError, match="^tokens: token id"):
        service.tokenize(Job({}, prompt=[1, len(tokenizer)], kind="detokenize"))


def test_logit_bias_changes_the_reply_and_ids_outside_the_vocabulary_are_refused(service):
    engine = service.wait_ready(0)
    banana = engine.encode(" banana")[0]
    biased, ids = chat(service, max_tokens=3, ignore_eos=True, logit_bias={str(banana): 100})  # as JSON carries it
    assert ids == [banana] * 3 and biased["outputs"][0]["text"] == " banana" * 3
    _, greedy_ids = chat(service, max_tokens=3)
    _, avoided = chat(service, max_tokens=1, logit_bias={str(greedy_ids[0]): -100})
    assert avoided[0] != greedy_ids[0]
    vocab = engine.engine.runner.cfg.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):  # the worker's refusal: a 400 naming it (runtime.py)
        service.submit("out-of-vocab", Job({**GREEDY, "logit_bias": {str(vocab): 1.0}}, ASK))


def test_prompt_logprobs_come_back_in_the_done_payload(service):
    engine = service.wait_ready(0)
    done, _ = run(service, Job({**GREEDY, "max_tokens": 2, "prompt_logprobs": 2}, prompt="The cat sat on the mat"))
    prompt_ids = engine.encode("The cat sat on the mat")
    entries = done["outputs"][0]["prompt_logprobs"]
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for token, entry in zip(prompt_ids[1:], entries[1:]):
        assert str(token) in entry and len(entry) in (2, 3)  # the prompt token and the top 2
        assert sorted(e["rank"] for e in entry.values())[:2] == [1, 2]  # the top 2 (the prompt token may be one)
        assert entry[str(token)]["decoded_token"] == engine.tokenizer.decode([token])
        assert entry[str(token)]["logprob"] <= 0
    plain, _ = run(service, Job({**GREEDY, "max_tokens": 2}, prompt="The cat sat on the mat"))
    assert "prompt_logprobs" not in plain["outputs"][0]
