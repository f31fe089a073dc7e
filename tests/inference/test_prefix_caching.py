"""Automatic prefix caching and copy-on-write sharing, checked against caching-off greedy output."""

import pytest

from inference import SamplingParams
from tests.inference.engines import get_llm

GREEDY = SamplingParams(temperature=0, max_tokens=12)
SYSTEM = ("You are a meticulous assistant for a public library. Answer briefly, cite the shelf when you "
          "recommend a book, never invent titles, and ask a clarifying question when a request is vague. ") * 8


def run(llm, prompts, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def ids(llm, text):
    return llm.get_tokenizer().encode(text, add_special_tokens=False)


def test_same_output_with_caching_on_and_off():
    on, off = get_llm(), get_llm(enable_prefix_caching=False)
    on.reset_prefix_cache()
    base = ids(on, SYSTEM)
    prompts = [
        {"prompt_token_ids": base + ids(on, "Question one?")},
        {"prompt_token_ids": base[:37] + ids(on, "mid-block prefix")},  # shares 2 full blocks + 5 tokens
        {"prompt_token_ids": base[:64]},  # whole prompt cached, block aligned
        {"prompt_token_ids": base + ids(on, "Question one?")},  # whole prompt cached
    ]
    want = run(off, prompts)
    first = run(on, prompts[:1])
    assert first == want[:1]
    hits_before = on.metrics()["prefix_cache_hits_total"]
    assert run(on, prompts[1:]) == want[1:]
    assert on.metrics()["prefix_cache_hits_total"] > hits_before


def test_second_request_with_same_system_prompt_computes_at_most_one_block_plus_suffix():
    llm = get_llm()
    llm.reset_prefix_cache()
    system = [{"role": "system", "content": SYSTEM}]
    first = llm.chat(system + [{"role": "user", "content": "Any good novels about the sea?"}], GREEDY)[0]
    assert len(first.prompt_token_ids) >= 300
    second = llm.chat(system + [{"role": "user", "content": "Where are the atlases?"}], GREEDY)[0]
    common = 0
    while first.prompt_token_ids[common] == second.prompt_token_ids[common]:
        common += 1
    suffix = len(second.prompt_token_ids) - common
    assert second.metrics.num_computed_prompt_tokens <= 16 + suffix
    assert second.num_cached_tokens >= common - 16


def test_multi_turn_chat_hits_its_history():
    llm = get_llm()
    llm.reset_prefix_cache()
    turn1 = [{"role": "user", "content": "Give me a name for a cat. " * 4}]
    reply = llm.chat(turn1, GREEDY)[0]
    turn2 = turn1 + [{"role": "assistant", "content": reply.outputs[0].text},
                     {"role": "user", "content": "And for a dog?"}]
    follow = llm.chat(turn2, GREEDY)[0]
    assert follow.num_cached_tokens >= (len(reply.prompt_token_ids) // 16) * 16


def test_hit_after_eviction_recomputes_correctly():
    # A pool of 20 blocks of 16: the second, unrelated long prompt evicts the first one's cached blocks.
    llm = get_llm(num_kv_blocks=20, max_model_len=320)
    off = get_llm(num_kv_blocks=20, max_model_len=320, enable_prefix_caching=False)
    a = {"prompt_token_ids": ids(llm, SYSTEM)[:200]}
    b = {"prompt_token_ids": ids(llm, "Completely different text about volcanoes and lava. " * 12)[:200]}
    want_a = run(off, [a])
    assert run(llm, [a]) == want_a
    evictions = llm.metrics()["evictions_total"]
    run(llm, [b])
    assert llm.metrics()["evictions_total"] > evictions
    assert run(llm, [a]) == want_a


def test_eviction_under_pressure_never_corrupts_running_requests():
    # 24 blocks: tight enough to preempt and evict even though the 8 prompts share their first blocks.
    llm = get_llm(num_kv_blocks=24, max_model_len=320)
    off = get_llm(num_kv_blocks=24, max_model_len=320, enable_prefix_caching=False)
    base = ids(llm, SYSTEM)[:120]
    prompts = [{"prompt_token_ids": base[: 40 + 10 * i] + ids(llm, f"Variant {i}.")} for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    assert run(llm, prompts, params) == run(off, prompts, params)
    assert llm.metrics()["num_preemptions_total"] > 0


def test_n4_stores_the_prompt_once_and_copies_on_write():
    llm = get_llm()
    llm.reset_prefix_cache()
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": ids(llm, SYSTEM)[:100]}  # 6 full blocks + 4 tokens
    engine.add_request("n4", prompt, SamplingParams(n=4, temperature=1.0, seed=1, max_tokens=8))
    while engine.requests["n4"].forked is False:
        engine.step()
    engine.step()  # every sample writes its first token: the shared partial block is copied 3 times
    snapshot = llm.metrics()
    engine.check_integrity()
    seqs = engine.requests["n4"].seqs
    assert len(seqs) == 4
    full_blocks = [seq.block_table[:6] for seq in seqs]
    assert all(t == full_blocks[0] for t in full_blocks)
    shared = [b for b in snapshot["block_map"] if b["ref_count"] == 4]
    assert len(shared) == 6 and all(b["owners"] == ["n4"] for b in shared)
    assert len({seq.block_table[6] for seq in seqs}) == 4
    assert snapshot["cow_copies_total"] >= 3
    assert snapshot["num_blocks_used"] == 6 + 4
    assert snapshot["num_blocks_shared"] == 6
    # Live slots: the 6 shared full blocks once, plus 5 tokens (positions 96-100) in each sample's own block.
    assert snapshot["kv_slot_utilization"] == (6 * 16 + 4 * 5) / ((6 + 4) * 16)
    assert [(s["index"], s["block_table"], s["context_len"], s["max_len"]) for s in snapshot["sequences"]] == [
        (seq.index, seq.block_table, 101, 108) for seq in sorted(seqs, key=lambda s: s.index)
    ]
    while engine.has_unfinished_requests():
        engine.step()


def test_forced_hash_collisions_never_serve_another_prompts_kv(monkeypatch):
    """With a block hash that sees only a block's last token, X and Z (same last token) collide, and Y's
    hash is the same under either. C = X + Y must not reuse the Y that was computed after Z."""
    monkeypatch.setattr("inference.block_manager.hash_block_tokens", lambda parent, tokens, extra=(): tokens[-1])
    on, off = get_llm(), get_llm(enable_prefix_caching=False)
    on.reset_prefix_cache()
    base = ids(on, SYSTEM)
    x, y = base[:16], base[16:48]
    z = ids(on, "Completely different words about volcanoes, lava, ash and the clouds over the sea")[:15] + x[-1:]
    assert len(z) == 16
    prompts = [{"prompt_token_ids": x + ids(on, " Hello")},
               {"prompt_token_ids": z + y + ids(on, " Question one?")},
               {"prompt_token_ids": x + y + ids(on, " Question two?")}]
    want = run(off, prompts)
    outputs = [on.generate([p], GREEDY)[0] for p in prompts]
    assert [o.outputs[0].token_ids for o in outputs] == want
    assert outputs[2].num_cached_tokens == 16  # x came from the cache; y was recomputed on x


def test_requests_sent_together_with_one_system_prompt_compute_it_once():
    """All at once, as a burst of users with one system prompt: the first computes it and the others map its
    blocks in the same step (promised to the prefix cache as it is scheduled), computing only their own
    questions; all four get their first token from that one step."""
    on, off = get_llm(), get_llm(enable_prefix_caching=False)
    on.reset_prefix_cache()
    base = ids(on, SYSTEM)
    prompts = [{"prompt_token_ids": base + ids(on, f"Question {word}?")} for word in ("one", "two", "three", "four")]
    outputs = on.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == run(off, prompts)
    assert outputs[0].metrics.num_computed_prompt_tokens == len(prompts[0]["prompt_token_ids"])
    cached = (len(base) // 16) * 16
    for out, prompt in zip(outputs[1:], prompts[1:]):
        assert out.num_cached_tokens >= cached
        assert out.metrics.num_computed_prompt_tokens == len(prompt["prompt_token_ids"]) - out.num_cached_tokens
    assert len({out.metrics.first_token_time for out in outputs}) == 1


def test_a_short_shared_header_does_not_hold_requests_back():
    """Only a block in common: everyone is admitted at once, the later ones mapping the first one's block."""
    on, off = get_llm(), get_llm(enable_prefix_caching=False)
    on.reset_prefix_cache()
    header = ids(on, SYSTEM)[:16]
    prompts = [{"prompt_token_ids": header + ids(on, f"A long and different question number {i} " * 6)}
               for i in range(3)]
    outputs = on.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == run(off, prompts)
    assert [o.num_cached_tokens for o in outputs] == [0, 16, 16]
    assert len({out.metrics.first_token_time for out in outputs}) == 1


def test_blocks_promised_for_a_step_that_fails_are_not_cached(monkeypatch):
    """A forward that raises after its blocks were promised to the prefix cache: they are taken back out (their
    K/V were never written), so the same prompt afterwards computes everything and still matches caching off."""
    on, off = get_llm(), get_llm(enable_prefix_caching=False)
    on.reset_prefix_cache()
    engine = on.llm_engine
    prompts = [{"prompt_token_ids": ids(on, SYSTEM) + ids(on, f"Question {word}?")} for word in ("one", "two")]

    def fail(*args, **kwargs):
        raise RuntimeError("the forward failed")

    monkeypatch.setattr(engine.runner, "execute", fail)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"doomed-{i}", prompt, GREEDY)
    with pytest.raises(RuntimeError, match="the forward failed"):
        engine.step()
    assert not engine.block_manager.promised
    for i in range(len(prompts)):
        engine.abort_request(f"doomed-{i}")
    engine.check_integrity()
    monkeypatch.undo()
    outputs = on.generate(prompts[:1], GREEDY)
    assert outputs[0].num_cached_tokens == 0
    assert [outputs[0].outputs[0].token_ids] == run(off, prompts[:1])
