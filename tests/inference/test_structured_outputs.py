"""Structured outputs: under the grammar mask every output of SmolLM2 parses and validates, and the mask
composes with sampling, n > 1, prefix caching, preemption, background compiles and bad input."""

import json
import math
import re
from concurrent.futures import Future

import jsonschema
import pytest
import torch

from inference import BeamSearchParams, RequestOutput, SamplingParams
from inference.sampling_params import StructuredOutputsParams
from inference.structured_outputs import _unpack, check_json_schema
from tests.inference.engines import get_llm

# Strings and arrays are bounded so that every output can finish within MAX_TOKENS.
SCHEMAS = {
    "nested object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20},
                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "array of objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"item": {"type": "string", "maxLength": 16},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["item", "qty"],
        },
        "minItems": 1,
        "maxItems": 3,
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "mood": {"type": "string", "enum": ["happy", "sad"]}},
        "required": ["color", "mood"],
    },
    "bounded numbers": {
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60},
                       "humidity": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}},
        "required": ["celsius", "humidity"],
    },
    "optional and nullable": {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 30},
                       "year": {"anyOf": [{"type": "integer", "minimum": 1900, "maximum": 2030}, {"type": "null"}]},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2}},
        "required": ["title", "year"],
    },
}
PROMPTS = {
    "nested object": "Give a person's name and address as JSON.",
    "array of objects": "List a few groceries with quantities as JSON.",
    "enums": "Pick a colour and a mood, as JSON.",
    "bounded numbers": "Report today's weather as JSON.",
    "optional and nullable": "Describe a film as JSON.",
}
MAX_TOKENS = 96


@pytest.fixture
def llm():
    return get_llm()


def chat(llm, prompt):
    return {"prompt_token_ids": llm.encode_chat([{"role": "user", "content": prompt}]), "prompt": None}


def constrained(schema, **kwargs):
    return SamplingParams(max_tokens=MAX_TOKENS, structured_outputs=StructuredOutputsParams(json=schema), **kwargs)


def assert_valid(output, schema):
    assert output.finish_reason == "stop", f"did not finish: {output.text!r}"
    jsonschema.validate(json.loads(output.text), schema)


@pytest.mark.slow
def test_every_output_validates_greedy_and_sampled_n4_with_prefix_caching(llm):
    names = list(SCHEMAS)
    prompts = [chat(llm, PROMPTS[name]) for name in names]
    greedy = llm.generate(prompts, [constrained(SCHEMAS[n], temperature=0) for n in names], use_tqdm=False)
    # Again, with 4 seeded samples each: the prompts now come from the prefix cache.
    again = llm.generate(
        prompts + prompts,
        [constrained(SCHEMAS[n], temperature=0) for n in names]
        + [constrained(SCHEMAS[n], temperature=1.0, n=4, seed=i) for i, n in enumerate(names)],
        use_tqdm=False,
    )
    for i, name in enumerate(names):
        first, cached, sampled = greedy[i], again[i], again[len(names) + i]
        assert_valid(first.outputs[0], SCHEMAS[name])
        assert cached.num_cached_tokens > 0
        assert cached.outputs[0].token_ids == first.outputs[0].token_ids
        assert len(sampled.outputs) == 4
        for output in sampled.outputs:
            assert_valid(output, SCHEMAS[name])
        # One mask count per generated token, per sample: each sample has its own matcher.
        for output in sampled.outputs:
            counts = sampled.metrics.masked_tokens[output.index]
            assert len(counts) == len(output.token_ids)
            assert all(0 <= c < llm.llm_engine.runner.cfg.vocab_size for c in counts)
    assert len({o.text for r in again[len(names):] for o in r.outputs}) > len(names)


def test_mask_keeps_an_allowed_argmax_token_for_token(llm):
    """When the unconstrained greedy text is the only allowed output, the mask must not change a token:
    an off-by-one in the mask would push the argmax elsewhere."""
    prompt = chat(llm, "Name three fruits.")
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    text = free[0].outputs[0].text
    forced = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12,
                                                 structured_outputs=StructuredOutputsParams(choice=[text])),
                          use_tqdm=False)[0]
    out = forced.outputs[0]
    assert out.token_ids == free[0].outputs[0].token_ids + [llm.get_tokenizer().eos_token_id]
    assert out.text == text and out.finish_reason == "stop"
    # The grammar admits one string: after its last token only the stop token is left.
    assert forced.metrics.masked_tokens[0][-1] == llm.llm_engine.runner.cfg.vocab_size - 1


def test_logprobs_under_the_mask_list_only_allowed_tokens(llm):
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=5,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    out = llm.generate(chat(llm, "Is water wet?"), params, use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no")
    for step in out.logprobs:
        assert 1 <= len(step) <= 5 and all(math.isfinite(v) for v in step.values())
    assert len(out.logprobs[-1]) == 1 and math.isclose(out.logprobs[-1][out.token_ids[-1]], 0.0, abs_tol=1e-5)


def test_regex_choice_grammar_and_json_object(llm):
    cases = [
        (StructuredOutputsParams(regex=r"[0-9]{3}-[0-9]{4}"), lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
        (StructuredOutputsParams(choice=["yes", "no"]), lambda t: t in ("yes", "no")),
        (StructuredOutputsParams(grammar='root ::= "The answer is " [0-9]+ "."'),
         lambda t: re.fullmatch(r"The answer is [0-9]+\.", t)),
    ]
    prompts = [chat(llm, "Give me a phone number."), chat(llm, "Is water wet?"), chat(llm, "What is 6 x 7?")]
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=24, structured_outputs=c)
                                     for c, _ in cases], use_tqdm=False)
    for (_, check), output in zip(cases, outputs):
        assert check(output.outputs[0].text), output.outputs[0].text
        assert output.outputs[0].finish_reason == "stop"
    # json_object: any object; the sampled run may stop at max_tokens, so check the start only.
    obj = llm.generate(chat(llm, "Say hi in JSON."), SamplingParams(
        temperature=0, max_tokens=64, structured_outputs=StructuredOutputsParams(json_object=True)), use_tqdm=False)
    text = obj[0].outputs[0].text
    assert text.startswith("{")
    if obj[0].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.slow
def test_constrained_requests_survive_preemption(llm):
    """A small KV pool forces recompute: kept matchers must still agree with the recomputed sequences, and
    a greedy constrained reply is the same token for token as without preemption."""
    small = get_llm(num_kv_blocks=20, max_model_len=256, max_num_seqs=16)
    schema, greedy_schema = SCHEMAS["array of objects"], SCHEMAS["nested object"]
    prompts = [chat(small, PROMPTS["array of objects"])] * 3 + [chat(small, PROMPTS["nested object"])]
    params = [constrained(schema, temperature=1.0, n=4, seed=i) for i in range(3)]
    params.append(constrained(greedy_schema, temperature=0))
    before = small.metrics()["num_preemptions_total"]
    outputs = small.generate(prompts, params, use_tqdm=False)
    assert small.metrics()["num_preemptions_total"] > before
    for request in outputs[:3]:
        for output in request.outputs:
            assert_valid(output, schema)
    alone = llm.generate(prompts[3], params[3], use_tqdm=False)[0].outputs[0]
    assert outputs[3].outputs[0].token_ids == alone.token_ids
    assert_valid(alone, greedy_schema)


def test_a_compiling_grammar_holds_only_its_own_request(llm):
    engine = llm.llm_engine
    plain = engine.make_request("plain", "Hello", SamplingParams(temperature=0, max_tokens=4))
    slow = engine.make_request("slow", "Hello", constrained(SCHEMAS["enums"], temperature=0))
    compiled, pending = slow.grammar, Future()
    slow.grammar = pending  # stands for a compile that has not finished
    engine.add(plain)
    engine.add(slow)
    finished = set()
    while "plain" not in finished:
        finished |= {o.request_id for o in engine.step() if o.finished}
    assert slow.seqs[0].num_computed_tokens == 0 and slow.seqs[0].matcher is None
    pending.set_result(compiled.result())
    while "slow" not in finished:
        finished |= {o.request_id for o in engine.step() if o.finished}
    assert_valid(RequestOutput.from_request(slow).outputs[0], SCHEMAS["enums"])


def test_a_failed_compile_ends_its_request_and_frees_everything(llm):
    engine = llm.llm_engine
    request = engine.make_request("broken", "Hello", constrained(SCHEMAS["enums"]))
    request.grammar = Future()
    request.grammar.set_exception(RuntimeError("out of memory"))
    engine.add(request)
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["broken"] and outputs[0].finished
    assert outputs[0].outputs[0].finish_reason == "abort"
    assert "out of memory" in outputs[0].outputs[0].stop_reason
    assert not engine.has_unfinished_requests()


def test_equal_constraints_compile_once(llm):
    manager = llm.llm_engine.structured
    schema = {"type": "object", "properties": {"once": {"type": "boolean"}}, "required": ["once"]}
    before = manager.num_compiles
    first = manager.request_grammar(StructuredOutputsParams(json=schema))
    second = manager.request_grammar(StructuredOutputsParams(json=json.dumps(schema)))
    assert second is first and manager.num_compiles == before + 1


@pytest.mark.parametrize("constraint, message", [
    ({"json": {"type": "strin"}}, r"structured_outputs\.json: invalid JSON schema at /type"),
    ({"json": "{not json"}, r"structured_outputs\.json: the schema is not valid JSON"),
    ({"json": {"type": "array", "uniqueItems": True}}, r"/uniqueItems: item uniqueness cannot be enforced"),
    ({"json": {"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}]}}}},
     r"/properties/a/oneOf: .*use anyOf"),
    ({"json": {"type": "string", "format": "color"}}, r"/format: format 'color' is not enforced"),
    ({"json": {"type": "number", "multipleOf": 0.5}}, r"/multipleOf: multipleOf is enforced only on integers"),
    ({"regex": "a["}, r"structured_outputs\.regex: Regex parsing error at position 3"),
    ({"grammar": "root ::= "}, r"structured_outputs\.grammar: EBNF parser error"),
    ({"json": {"type": "object"}, "regex": "a"}, r"exactly one of .*got json, regex"),
    ({"choice": []}, r"StructuredOutputsParams\.choice must be a non-empty list"),
    ({"choise": ["a"]}, r"SamplingParams\.structured_outputs: .*choise"),
])
def test_bad_constraints_name_the_problem_and_leave_nothing(llm, constraint, message):
    with pytest.raises(ValueError, match=message):
        llm.generate("Hi", SamplingParams(structured_outputs=constraint), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_check_json_schema_reaches_every_subschema():
    with pytest.raises(ValueError, match=r"/\$defs/p/items/not: "):
        check_json_schema({"$defs": {"p": {"type": "array", "items": {"not": {"type": "null"}}}}})
    assert check_json_schema('{"type": "integer"}') == {"type": "integer"}


def test_beam_search_refuses_structured_outputs():
    with pytest.raises(ValueError, match="beam search does not support structured outputs"):
        BeamSearchParams(beam_width=2, max_tokens=4, structured_outputs=StructuredOutputsParams(json_object=True))


def test_unpacked_mask_matches_xgrammars_own_kernel():
    import xgrammar as xgr

    vocab = 70
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 3), dtype=torch.int32)
    logits = torch.randn(3, vocab)
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask, vocab_size=vocab)
    ours = logits.masked_fill(~_unpack(bitmask, vocab), float("-inf"))
    assert torch.equal(ours, expected)
