"""Hypothesis over the parsers of both front doors, 10,000+ cases each, printed with the test output:
the chat socket's `parse_frame` (the edge's decoding, then generate / cancel) and the API's `parse_body`
then `parse_chat` / `parse_completion` / `parse_tokenize` / `parse_detokenize`. Inputs mix valid requests, spoiled ones, hostile text (unpaired
surrogates, NUL, line separators, BOMs), deep nesting, huge numbers and raw garbage. Every case is either
accepted — and then holds only text that UTF-8 (the tokenizer, SQLite, PostgreSQL) takes — or refused with
the client's error (InvalidInput; an ApiError with a 4xx status); anything else would be a 500. No case
may take more than a second (no hang). Then the same inputs, fewer, through the real ASGI application
(consumer and views) with a scripted worker: no 500 status, no "internal server error" frame."""
import asyncio
import contextlib
import json
import time

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import AsyncClient
from fake_worker import ORIGIN, worker
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from playground.api.errors import ApiError
from playground.accounts.models import ApiKey
from playground.api import response_api
from playground.api.schema import (DEFAULT_ONLY, EXTRA_SAMPLING, PROMPT_FIELDS, TEMPLATE_FIELDS, parse_body, parse_chat,
                                   parse_completion)
from playground.api.tokenization import parse_detokenize, parse_tokenize
from playground.asgi import application
from playground.chat.protocol import Cancel, Compare, Generate, parse_frame
from playground.serving.web import sampling
from playground.serving.web.edge import InvalidInput

pytestmark = pytest.mark.slow
MODEL = settings.PLAYGROUND_ENGINE["model"]
LIMITS = settings.PLAYGROUND_LIMITS
CASES = 10_000  # per front door: the socket's frames, and the API's bodies split between its five endpoints
API_ENDPOINTS = ["chat", "completions", "responses", "tokenize", "detokenize"]
ASGI_CASES = 400


def fuzz(cases: int):
    return hypothesis_settings(max_examples=cases, deadline=None, suppress_health_check=list(HealthCheck),
                               derandomize=True, database=None)


hostile_char = st.one_of(st.characters(), st.sampled_from(["\ud800", "\udbff", "\udfff", "\x00", "\u2028",
                                                          "\ufeff", "\U0010ffff", '"', "\\", "[", "{"]))
text = st.text(hostile_char, max_size=16)
numbers = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([10**400, -(10**400), 2**63, 2**53]), st.floats())
json_values = st.recursive(
    st.none() | st.booleans() | numbers | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=5,
)
sampling_values = st.fixed_dictionaries({}, optional={name: json_values for name in sampling.NAMES})
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer", "x"]),
                                           "content": st.one_of(text, json_values)}), max_size=4)


def with_junk(objects):
    """Objects with, sometimes, unknown fields of any name and value."""
    return st.tuples(objects, st.dictionaries(text, json_values, max_size=2)).map(lambda t: {**t[1], **t[0]})


sides = st.lists(st.one_of(with_junk(st.fixed_dictionaries(
    {}, optional={"params": st.one_of(sampling_values, json_values), "model": st.one_of(st.just(MODEL), json_values)})),
    json_values), max_size=3)  # a compare frame's settings A and B, or anything else
generate_frames = with_junk(st.fixed_dictionaries(
    {"type": st.sampled_from(["generate", "compare", "cancel", "other"])},
    optional={"messages": messages, "params": st.one_of(sampling_values, json_values), "sides": sides,
              "conversation_id": json_values, "request_id": json_values},
))
# vLLM's fields (schema.py) and the Responses API's (response_api.py).
VLLM_FIELDS = sorted((EXTRA_SAMPLING | set(DEFAULT_ONLY) | PROMPT_FIELDS | TEMPLATE_FIELDS | response_api.FIELDS)
                     - set(sampling.NAMES) - {"model", "stream", "messages", "prompt", "stream_options", "logprobs", "top_logprobs"}
                     | {"best_of"})
api_bodies = with_junk(st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, "other"])},
    optional={"messages": messages, "prompt": st.one_of(text, json_values), "stream": json_values,
              "stream_options": json_values, "logprobs": json_values, "top_logprobs": json_values,
              "tokens": json_values, "add_special_tokens": json_values, "return_token_strs": json_values,
              "max_completion_tokens": json_values, **{name: json_values for name in sampling.NAMES},
              **{name: json_values for name in VLLM_FIELDS}},
))


words = st.text(min_size=1, max_size=12).filter(str.strip)
good_messages = st.builds(lambda first, last: first + [{"role": "user", "content": last}],
                          st.lists(st.fixed_dictionaries({"role": st.just("system"), "content": words}), max_size=1),
                          words)
good_sampling = {"temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 50),
                 "max_tokens": st.integers(1, 8), "n": st.integers(1, 2), "seed": st.integers(0, 2**32),
                 "stop": st.lists(words, max_size=2)}
good_extras = {"min_tokens": st.integers(0, 1), "ignore_eos": st.booleans(), "stop_token_ids": st.lists(st.integers(0, 50), max_size=2),
               "skip_special_tokens": st.booleans(), "include_stop_str_in_output": st.booleans(),
               "truncate_prompt_tokens": st.integers(1, 8), "echo": st.booleans(), "stream": st.booleans(),
               "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans(),
                                                                     "continuous_usage_stats": st.booleans()})}
prompts = st.one_of(words, st.lists(st.one_of(words, st.lists(st.integers(0, 1000), min_size=1, max_size=4)), min_size=1,
                                    max_size=3))
valid_bodies = st.one_of(
    st.fixed_dictionaries({"model": st.just(MODEL), "messages": good_messages},
                          optional={**good_sampling, **good_extras, "add_generation_prompt": st.booleans()}),
    st.fixed_dictionaries({"model": st.just(MODEL), "prompt": prompts}, optional={**good_sampling, **good_extras}),
    st.fixed_dictionaries({"model": st.just(MODEL), "input": st.one_of(words, good_messages)},
                          optional={"instructions": words, "max_output_tokens": st.integers(1, 8), "stream": st.booleans()}),
    # /tokenize (text or chat) and /detokenize
    st.fixed_dictionaries({"prompt": words}, optional={"model": st.just(MODEL), "add_special_tokens": st.booleans(),
                                                       "return_token_strs": st.booleans()}),
    st.fixed_dictionaries({"messages": good_messages}, optional={"add_generation_prompt": st.booleans(),
                                                                 "return_token_strs": st.booleans()}),
    st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 2000), max_size=6)}, optional={"model": st.just(MODEL)}),
)
good_settings = st.fixed_dictionaries({}, optional={"params": st.fixed_dictionaries({}, optional=good_sampling),
                                                    "model": st.just(MODEL)})
valid_frames = st.one_of(
    st.fixed_dictionaries({"type": st.just("generate"), "messages": good_messages},
                          optional={"params": st.fixed_dictionaries({}, optional=good_sampling)}),
    st.fixed_dictionaries({"type": st.just("compare"), "messages": good_messages,
                           "sides": st.lists(good_settings, min_size=2, max_size=2)}),
)


def spoiled(valid):
    """A valid object with one field (known or not) set to anything at all."""
    return st.tuples(valid, st.one_of(text, st.sampled_from(["messages", "prompt", "params", *sampling.NAMES])),
                     json_values).map(lambda t: {**t[0], t[1]: t[2]})


def nested(depth: int) -> str:
    return '{"type": "generate", "messages": ' + "[" * depth + "]" * depth + "}"


raw_frames = st.one_of(
    valid_frames.map(json.dumps), spoiled(valid_frames).map(json.dumps), generate_frames.map(json.dumps),
    valid_bodies.map(json.dumps), spoiled(valid_bodies).map(json.dumps), api_bodies.map(json.dumps),
    json_values.map(json.dumps), text, st.integers(1, 60_000).map(nested),
    st.binary(max_size=24).map(lambda b: b.decode("latin-1")),
)


def storable(value, nul: bool = False) -> None:
    """Accepted input must encode as UTF-8 (what the tokenizer takes) and, unless `nul` (the API's, which nothing
    stores), hold no NUL (what the databases take)."""
    encoded = json.dumps(value, ensure_ascii=False).encode("utf-8")
    assert nul or (b"\\u0000" not in encoded and b"\x00" not in encoded)


def timed(call, *args):
    """`call(*args)`, failing if it takes a second twice: a pathological input is slow every time, a pause of
    the machine (as once in a full run of the suite, whose retry took milliseconds) is not."""
    started = time.monotonic()
    try:
        return call(*args)
    finally:
        if time.monotonic() - started >= 1.0:
            again = time.monotonic()
            with contextlib.suppress(Exception):
                call(*args)
            assert time.monotonic() - again < 1.0, "a parse took over a second, twice"


def report(capsys, what: str, outcomes: dict[str, int]) -> None:
    with capsys.disabled():
        print(f"\nfuzz {what}: {sum(outcomes.values())} cases, {outcomes}")


def test_socket_parser_fuzz(capsys):
    outcomes = {"accepted": 0, "refused": 0}

    @fuzz(CASES)
    @given(frame=raw_frames)
    def case(frame: str) -> None:
        try:
            request = timed(parse_frame, frame, sampling.defaults(LIMITS), LIMITS)
        except InvalidInput as exc:
            str(exc).encode("utf-8")  # the error frame itself must be sendable
            outcomes["refused"] += 1
            return
        outcomes["accepted"] += 1
        if isinstance(request, Cancel):
            storable(request.request_id)
        generations = request.sides if isinstance(request, Compare) else [request] if isinstance(request, Generate) else []
        for generate in generations:
            storable(generate.messages)
            storable(generate.params)

    case()
    report(capsys, "websocket frames", outcomes)
    assert sum(outcomes.values()) >= CASES and outcomes["accepted"] and outcomes["refused"]


@pytest.mark.parametrize("endpoint", API_ENDPOINTS)
def test_api_parser_fuzz(capsys, endpoint):
    outcomes = {"accepted": 0, "refused": 0}
    bodies = st.one_of(valid_bodies.map(json.dumps), raw_frames).map(lambda s: s.encode("utf-8", "surrogatepass"))

    def parse(raw: bytes):
        body = parse_body(raw, LIMITS, settings.PLAYGROUND_API["max_body_bytes"])
        defaults = sampling.api_defaults(endpoint != "completions", LIMITS)
        if endpoint == "chat":
            return parse_chat(body, [MODEL], defaults, LIMITS)
        if endpoint == "responses":
            return parse_chat(response_api.to_chat(body)[0], [MODEL], defaults, LIMITS)
        if endpoint in ("tokenize", "detokenize"):
            parse_tokenizer = parse_tokenize if endpoint == "tokenize" else parse_detokenize
            return parse_tokenizer(body, [MODEL], LIMITS, settings.PLAYGROUND_API["max_prompt_chars"])
        return parse_completion(body, [MODEL], defaults, LIMITS, settings.PLAYGROUND_API["max_prompt_chars"])

    @fuzz(CASES // len(API_ENDPOINTS))
    @given(raw=bodies)
    def case(raw: bytes) -> None:
        try:
            request = timed(parse, raw)
        except ApiError as exc:
            assert 400 <= exc.status < 500 and json.dumps(exc.body()).encode("utf-8")
            outcomes["refused"] += 1
            return
        outcomes["accepted"] += 1
        if endpoint in ("tokenize", "detokenize"):
            storable(request.job.to_task(), nul=True)
        else:
            storable([request.messages, request.prompts, request.params, request.job_options, request.echo], nul=True)

    case()
    report(capsys, f"API {endpoint} bodies", outcomes)
    assert sum(outcomes.values()) >= CASES // len(API_ENDPOINTS) and outcomes["accepted"] and outcomes["refused"]


async def get(path: str, secret: str) -> int:
    return (await AsyncClient().get(path, headers={"Authorization": f"Bearer {secret}"})).status_code


@pytest.mark.django_db(transaction=True)
def test_the_asgi_application_never_answers_500(monkeypatch, capsys):
    _, secret = ApiKey.objects.issue(User.objects.create(username="fuzzer"))
    statuses: dict[int, int] = {}
    frames: dict[str, int] = {}

    async def scenario(inputs: list[str]) -> None:
        async with worker(monkeypatch, delay=0.0005):
            client = AsyncClient()
            ws = WebsocketCommunicator(application, "/ws/chat/", headers=[ORIGIN])
            assert (await ws.connect(timeout=5))[0]
            for raw in inputs:
                for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize"):
                    response = await client.post(path, raw.encode("utf-8", "surrogatepass"),
                                                 content_type="application/json",
                                                 headers={"Authorization": f"Bearer {secret}"})
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    if response.streaming:
                        async for _ in response.streaming_content:
                            pass
                if not raw:  # the test communicator cannot send an empty text frame
                    continue
                await ws.send_to(text_data=raw)
                answer = await ws.receive_json_from(timeout=10)
                frames[answer["type"]] = frames.get(answer["type"], 0) + 1
                assert answer.get("message") != "internal server error", (raw, answer)
                # A generation ends with its done or error; a compare (two at once) with one of those for each side.
                running = {"started": 1, "compare_started": len(answer.get("request_ids", []))}.get(answer["type"], 0)
                while running:
                    answer = await ws.receive_json_from(timeout=10)
                    assert answer["type"] in ("token", "done", "error"), (raw, answer)
                    assert answer.get("message") != "internal server error", (raw, answer)
                    running -= answer["type"] in ("done", "error")
            await ws.disconnect()

    inputs: list[str] = []

    @fuzz(ASGI_CASES)
    @given(raw=raw_frames)
    def collect(raw: str) -> None:
        inputs.append(raw)

    collect()
    asyncio.run(scenario(inputs))
    # The worker has stopped by now: /health rightly answers 503 (no engine ready), the others 200.
    assert asyncio.run(get("/health", secret)) == 503
    for path in ("/version", "/v1/models"):
        status = asyncio.run(get(path, secret))
        statuses[status] = statuses.get(status, 0) + 1
    report(capsys, "ASGI (API bodies, five times each, and socket frames)",
           {f"http {k}": v for k, v in statuses.items()} | {f"ws {k}": v for k, v in frames.items()})
    assert 500 not in statuses and all(status < 500 for status in statuses)
