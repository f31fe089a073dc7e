"""Multi-LoRA: real PEFT adapters (non-identity, `init_lora_weights=False`) on a tiny random Llama; the oracle is
HF `PeftModel.merge_and_unload()` greedy in float32. Mixed batches, slot waits, the prefix cache, bad adapters."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from inference import LLM, LoRAError, LoRARequest, SamplingParams, StreamingEngine
from tests.inference.engines import assert_idle
from tests.inference.oracle_prompts import ORACLE_PROMPTS
from tests.inference.tiny_models import SHAPE, save_tiny

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = ["Hello there", "The quick brown fox jumps over", "One, two, three, four, five, six, seven, eight"]
ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base, folder, seed, **lora):
    """Save a random PEFT adapter for `base` to `folder`; return the merged HF model (the oracle)."""
    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(init_lora_weights=False, **lora))
    peft_model.save_pretrained(folder)
    return peft_model.merge_and_unload().eval()


def hf_greedy(model, token_ids, max_new_tokens=10):
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(token_ids):].tolist()


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama, two adapters on it (a: q/v rank 8; b: every projection, rank 4, rsLoRA) and their
    merged HF models."""
    root = tmp_path_factory.mktemp("lora")
    base = save_tiny(root / "base", LlamaForCausalLM, LlamaConfig(**SHAPE, tie_word_embeddings=False))
    merged = {
        "a": make_adapter(base, root / "a", 1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        "b": make_adapter(base, root / "b", 2, r=4, lora_alpha=8, target_modules=ALL_MODULES, use_rslora=True),
    }
    requests = {"a": LoRARequest("a", 1, str(root / "a")), "b": LoRARequest("b", 2, str(root / "b"))}
    return {"root": root, "base": base, "merged": merged, "requests": requests}


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(model=str(tiny["root"] / "base"), num_kv_blocks=64, max_model_len=256, enable_lora=True, max_loras=2,
               max_lora_rank=8)


def prompt_ids(llm, text):
    return {"prompt_token_ids": llm.get_tokenizer().encode(text, add_special_tokens=False)}


def test_greedy_per_adapter_equals_merged_hf(tiny, llm):
    for name in ("a", "b"):
        for text in PROMPTS:
            prompt = prompt_ids(llm, text)
            ours = tokens(llm.generate(prompt, GREEDY, lora_request=tiny["requests"][name]))[0]
            assert ours == hf_greedy(tiny["merged"][name], prompt["prompt_token_ids"]), (name, text)
    prompt = prompt_ids(llm, PROMPTS[1])
    base = tokens(llm.generate(prompt, GREEDY))[0]
    assert base == hf_greedy(tiny["base"], prompt["prompt_token_ids"])
    adapted = {n: tokens(llm.generate(prompt, GREEDY, lora_request=r))[0] for n, r in tiny["requests"].items()}
    assert len({tuple(base), tuple(adapted["a"]), tuple(adapted["b"])}) == 3  # the adapters change the output
    assert_idle(llm)


def test_one_batch_mixing_base_and_two_adapters_equals_each_alone(tiny, llm):
    a, b = tiny["requests"]["a"], tiny["requests"]["b"]
    prompts = [prompt_ids(llm, t) for t in PROMPTS for _ in range(3)]
    loras = [None, a, b] * len(PROMPTS)
    alone = [tokens(llm.generate(p, GREEDY, lora_request=lora))[0] for p, lora in zip(prompts, loras)]
    assert tokens(llm.generate(prompts, GREEDY, lora_request=loras)) == alone
    assert_idle(llm)


def test_prompt_logprobs_in_a_batch_regrouped_by_adapter_equal_merged_hf(tiny, llm):
    # The runner lays a LoRA batch out by adapter: the prompt-logprob rows must follow their sequences there.
    names = ["b", None, "a"]
    prompts = [prompt_ids(llm, t) for t in PROMPTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1),
                        lora_request=[tiny["requests"][n] if n else None for n in names])
    for name, prompt, out in zip(names, prompts, outs):
        ids = prompt["prompt_token_ids"]
        model = tiny["merged"][name] if name else tiny["base"]
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        got = torch.tensor([entry[t].logprob for t, entry in zip(ids[1:], out.prompt_logprobs[1:])])
        assert torch.allclose(got, expected[torch.arange(len(ids) - 1), ids[1:]], atol=1e-4), name
    assert_idle(llm)


def test_prefix_cache_shares_blocks_only_under_the_same_adapter(tiny, llm):
    off = LLM(model=str(tiny["root"] / "base"), num_kv_blocks=64, max_model_len=256, enable_lora=True, max_loras=2,
              max_lora_rank=8, enable_prefix_caching=False)
    a, b = tiny["requests"]["a"], tiny["requests"]["b"]
    # 40 shared tokens (2 full blocks of 16) and a different tail per request.
    shared = prompt_ids(llm, " ".join(["word"] * 40))["prompt_token_ids"][:40]
    prompts = [{"prompt_token_ids": shared + prompt_ids(llm, f" tail {i}")["prompt_token_ids"]} for i in range(6)]
    loras = [a, b, None, a, b, None]
    llm.reset_prefix_cache()
    first = llm.generate(prompts[:3], GREEDY, lora_request=loras[:3])
    assert [o.num_cached_tokens for o in first] == [0, 0, 0]  # same tokens, three adapters: nothing shared
    second = llm.generate(prompts[3:], GREEDY, lora_request=loras[3:])
    assert [o.num_cached_tokens for o in second] == [32, 32, 32]  # each reuses its own adapter's blocks
    assert tokens(first + second) == tokens(off.generate(prompts, GREEDY, lora_request=loras))
    assert_idle(llm)
    assert_idle(off)


def test_a_request_waits_for_a_slot_and_is_served(tiny):
    one_slot = LLM(model=str(tiny["root"] / "base"), num_kv_blocks=64, max_model_len=256, enable_lora=True,
                   max_loras=1, max_lora_rank=8)
    a, b = tiny["requests"]["a"], tiny["requests"]["b"]
    prompts = [prompt_ids(one_slot, t) for t in PROMPTS]
    loras = [a, b, None]
    mixed = one_slot.generate(prompts, GREEDY, lora_request=loras)
    assert tokens(mixed) == [hf_greedy(tiny["merged"]["a"], prompts[0]["prompt_token_ids"]),
                             hf_greedy(tiny["merged"]["b"], prompts[1]["prompt_token_ids"]),
                             hf_greedy(tiny["base"], prompts[2]["prompt_token_ids"])]
    # b could not start before a's sequence had finished and released the only slot.
    assert mixed[1].metrics.first_scheduled_time >= mixed[0].metrics.finished_time - 1e-3
    assert one_slot.llm_engine.runner.lora.num_slot_loads == 2
    assert_idle(one_slot)


def test_streaming_engine_serves_adapters(tiny, llm):
    engine = StreamingEngine(model=str(tiny["root"] / "base"), num_kv_blocks=64, max_model_len=256, enable_lora=True,
                             max_loras=2, max_lora_rank=8)
    engine.start()
    try:
        prompt = prompt_ids(llm, PROMPTS[0])["prompt_token_ids"]
        streams = [engine.add_request(prompt, GREEDY, lora_request=r) for r in (tiny["requests"]["b"], None)]
        got = [[t for d in s for t in d.token_ids] for s in streams]
        assert got == [hf_greedy(tiny["merged"]["b"], prompt), hf_greedy(tiny["base"], prompt)]
        with pytest.raises(LoRAError, match="no such adapter folder"):
            engine.add_request(prompt, GREEDY, lora_request=LoRARequest("gone", 9, str(tiny["root"] / "gone")))
    finally:
        engine.shutdown()


def write_adapter(folder, config_changes=None, weights=None, source=None):
    """A copy of adapter `source` with its config edited and/or its weights file replaced."""
    folder.mkdir()
    config = json.loads((source / "adapter_config.json").read_text())
    config.update(config_changes or {})
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(weights if weights is not None else
                                                       (source / "adapter_model.safetensors").read_bytes())
    return LoRARequest(folder.name, 7, str(folder))


def test_bad_adapters_are_clear_errors_and_the_engine_keeps_serving(tiny, llm, tmp_path):
    a = tiny["root"] / "a"
    cases = [
        (LoRARequest("missing", 5, str(tmp_path / "nowhere")), "no such adapter folder"),
        (write_adapter(tmp_path / "big", {"r": 16}, source=a), "rank 16 is above max_lora_rank=8"),
        (write_adapter(tmp_path / "lm_head", {"target_modules": ["q_proj", "lm_head"]}, source=a),
         "target module\\(s\\) lm_head are not in this model"),
        (write_adapter(tmp_path / "corrupt", weights=b"\x00garbage" * 10, source=a), "is corrupt"),
        (write_adapter(tmp_path / "truncated", weights=(a / "adapter_model.safetensors").read_bytes()[:200], source=a),
         "is corrupt"),
        (write_adapter(tmp_path / "dora", {"use_dora": True}, source=a), "use_dora=True is not supported"),
        (write_adapter(tmp_path / "liar", {"r": 4}, source=a), "has shape \\(8, 64\\), expected \\(4, 64\\)"),
    ]
    prompt = prompt_ids(llm, PROMPTS[0])
    for request, message in cases:
        with pytest.raises(LoRAError, match=message):
            llm.generate([prompt, prompt], GREEDY, lora_request=[None, request])
        assert not llm.llm_engine.has_unfinished_requests()  # the good prompt beside it was not queued either
    with pytest.raises(LoRAError, match="enable_lora=True"):
        LLM(model=str(tiny["root"] / "base"), num_kv_blocks=64, max_model_len=256).generate(
            prompt, GREEDY, lora_request=tiny["requests"]["a"])
    with pytest.raises(LoRAError, match="lora_int_id"):
        LoRARequest("x", 0, str(a))
    with pytest.raises(ValueError, match="got 1 LoRA requests for 2 prompts"):
        llm.generate([prompt, prompt], GREEDY, lora_request=[None])
    assert tokens(llm.generate(prompt, GREEDY, lora_request=tiny["requests"]["a"]))[0] == hf_greedy(
        tiny["merged"]["a"], prompt["prompt_token_ids"])
    assert_idle(llm)


@pytest.mark.slow
def test_smollm2_adapter_greedy_equals_merged_hf(hf_model, tmp_path):
    merged = make_adapter(hf_model, tmp_path / "smol", 3, r=8, lora_alpha=16, target_modules=ALL_MODULES)
    llm = LLM(num_kv_blocks=128, max_model_len=512, enable_lora=True, max_loras=1, max_lora_rank=8)
    lora = LoRARequest("smol", 1, str(tmp_path / "smol"))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    tok = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in ORACLE_PROMPTS[:4]]
    ours = tokens(llm.generate(prompts, params, lora_request=lora))
    assert ours == [hf_greedy(merged, p["prompt_token_ids"], 16) for p in prompts]
    assert ours != tokens(llm.generate(prompts, params))  # the adapter changes SmolLM2's output
    assert_idle(llm)


def test_slots_are_replaced_least_recently_used_and_the_host_cache_is_bounded(tiny, tmp_path):
    llm = LLM(model=str(tiny["root"] / "base"), num_kv_blocks=64, max_model_len=256, enable_lora=True, max_loras=2,
              max_lora_rank=8)
    c = write_adapter(tmp_path / "c", source=tiny["root"] / "b")
    c = LoRARequest("c", 3, c.lora_path)  # the same weights as b under another name and id
    a, b = tiny["requests"]["a"], tiny["requests"]["b"]
    d = LoRARequest("d", 4, str(tiny["root"] / "a"))
    manager = llm.llm_engine.runner.lora
    prompt = prompt_ids(llm, PROMPTS[0])
    loads = []
    for lora in (a, b, a, c, d):
        llm.generate(prompt, GREEDY, lora_request=lora)
        loads.append(manager.num_slot_loads)
    # Two slots: a, b loaded; a again and c (b's weights: one digest, one slot) and d (a's) are hits.
    assert loads == [1, 2, 2, 2, 2]
    before = manager.num_slot_loads
    e = write_adapter(tmp_path / "e", {"lora_alpha": 3}, source=tiny["root"] / "a")  # new weights: a new digest
    for lora in (e, b, a, b):  # e evicts b (least recently used: d touched a), b evicts a, a evicts e, b hits
        llm.generate(prompt, GREEDY, lora_request=lora)
    assert manager.num_slot_loads - before == 3
    # The host cache holds max_cpu_loras (= max_loras = 2) adapters: a was read again after e and b.
    first = manager.get(a)
    manager.get(e), manager.get(b)
    again = manager.get(a)
    assert again is not first and again.digest == first.digest
    assert_idle(llm)
