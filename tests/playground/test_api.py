"""The OpenAI-compatible API with the official `openai` client against the running embedded playground
(daphne, in-process Celery worker, real model): chat and completions, streaming and not, n=2, stop,
logprobs, usage; greedy texts equal the engine's own; the seeds' keyless example 4, 429 over a limit, 400 for a
prompt too long for the model; websockets from a foreign Origin are refused; response_format json_schema
replies validate, refused schemas are 400s naming the problem, and a tool call makes a round trip."""
import json

import jsonschema
import openai
import pytest
import requests
from api_server import MODEL, reference_llm, start
from structured_cases import TOOLS, WEATHER, WEATHER_CHAT
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    live = start(tmp_path_factory.mktemp("api"))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api_base, api_key=server.api_key("alice"), max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def greedy():
    """(chat texts, completion texts) of the engine run offline, greedy, 8 tokens."""
    from inference import SamplingParams

    llm = reference_llm()
    params = SamplingParams(temperature=0, max_tokens=8)
    chat = llm.chat([CHAT], params, use_tqdm=False)[0].outputs[0].text
    completion = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].text
    return chat, completion


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_greedy_equals_the_engine_and_reports_usage(client, greedy):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=8)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == greedy[0]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    # Same prompt again: its full blocks come from the prefix cache.
    again = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_completion_tokens=8)
    assert again.choices[0].message.content == greedy[0]
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_stream_concatenates_to_the_greedy_text(client, greedy):
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy[0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_completion_greedy_stream_and_not(client, greedy):
    reply = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8)
    assert reply.object == "text_completion" and reply.choices[0].text == greedy[1]
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == greedy[1]


def test_n2_gives_two_seeded_samples(client):
    kwargs = dict(model=MODEL, messages=CHAT, temperature=1.0, max_tokens=6, n=2, seed=7)
    reply = client.chat.completions.create(**kwargs)
    assert sorted(c.index for c in reply.choices) == [0, 1]
    assert all(c.message.content for c in reply.choices)
    assert 2 <= reply.usage.completion_tokens <= 12
    streamed = list(client.chat.completions.create(**kwargs, stream=True))
    texts = {0: "", 1: ""}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {c.index: c.message.content for c in reply.choices}  # same seed, same samples


def test_stop_string_ends_the_reply(client, greedy):
    cut = greedy[1][2:4]  # a piece of the greedy continuation, found after its start
    reply = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, stop=[cut])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == greedy[1][: greedy[1].index(cut)]


def test_logprobs_chat_and_completion(client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=4, logprobs=True,
                                           top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)  # greedy takes the most likely
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)
    completion = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0


def test_the_seeds_example_4_runs_as_written_without_a_key(server):
    """vLLM's `requests.post(".../v1/completions", json={...}).json()`, on the embedded default (loopback, no
    REDIS_URL): no key, answered under the anonymous limits. Keys required: test_api_distributed.py."""
    payload = {"model": MODEL, "prompt": PROMPT, "max_tokens": 50}
    completion = requests.post(f"{server.api_base}/completions", json=payload, timeout=300).json()
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"]
    assert 1 <= completion["usage"]["completion_tokens"] <= 50


def test_over_the_tokens_per_minute_limit_is_429(server):
    key = server.api_key("tiny")
    server.set_quota("tiny", tokens_per_minute=5)
    tiny = openai.OpenAI(base_url=server.api_base, api_key=key, max_retries=0, timeout=300)
    tiny.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4)  # under the limit: served
    with pytest.raises(openai.RateLimitError) as limited:
        tiny.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4)
    assert limited.value.status_code == 429
    assert "tokens per minute" in limited.value.body["message"]


def test_prompt_too_long_for_the_model_is_400_streaming_or_not(client, server):
    too_long = "hello " * 600  # over max_model_len (512) tokens, under the character cap
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt=too_long, max_tokens=4, stream=stream)
        assert "max_model_len" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as capped:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10**6)
    assert capped.value.body["param"] == "max_tokens"
    server.wait_idle()


@pytest.mark.parametrize("path", ["/ws/chat/", "/ws/demo/"])
def test_websocket_from_a_foreign_origin_is_refused(server, path):
    url = f"ws://127.0.0.1:{server.port}{path}"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="http://evil.example", proxy=None, open_timeout=10)
    assert refused.value.response.status_code == 403
    with connect(url, origin=server.base_url, proxy=None, open_timeout=10):  # the page's own origin is let in
        pass


def test_closing_a_stream_aborts_the_generation_and_frees_its_blocks(client, server):
    stream = client.completions.create(model=MODEL, prompt="Count from one to one thousand:", temperature=0,
                                       max_tokens=1000, stream=True)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    stream.close()
    metrics = server.wait_idle(timeout=5)  # 1000 tokens take far longer on a CPU: it was aborted
    assert metrics["num_blocks_free"] + metrics["num_blocks_cached"] == metrics["num_blocks_total"]


# --- structured outputs and tools (playground/api/structured.py) ------------------------------------

def test_openai_client_json_schema_replies_validate(client, server):
    response_format = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    reply = client.chat.completions.create(model=MODEL, messages=WEATHER_CHAT, response_format=response_format,
                                           temperature=1.0, seed=3, n=2, max_tokens=48)
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), WEATHER)
    streamed = client.chat.completions.create(model=MODEL, messages=WEATHER_CHAT, response_format=response_format,
                                              temperature=0, max_tokens=48, stream=True)
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in streamed if c.choices)), WEATHER)
    server.wait_idle()


def test_openai_client_refused_schema_is_400_naming_the_problem(client, server):
    bad = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused_schema:
            client.chat.completions.create(model=MODEL, messages=WEATHER_CHAT, max_tokens=8, stream=stream,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "t", "schema": bad}})
        message = refused_schema.value.body["message"]
        assert message.startswith("response_format.json_schema.schema:") and "/properties/tags/uniqueItems" in message
    with pytest.raises(openai.BadRequestError) as refused_tool:
        client.chat.completions.create(model=MODEL, messages=WEATHER_CHAT, max_tokens=8, tool_choice="required", tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}])
    assert "function 'f' parameters" in refused_tool.value.body["message"]
    server.wait_idle()


def test_openai_client_tool_call_round_trip(client, server):
    first = client.chat.completions.create(model=MODEL, messages=WEATHER_CHAT, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=48)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(arguments, schema)
    # Streamed, the call arrives as a tool_calls delta the client's chunks carry.
    chunks = list(client.chat.completions.create(model=MODEL, messages=WEATHER_CHAT, tools=TOOLS, tool_choice="required",
                                                 temperature=0, max_tokens=48, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas] == [call.function.name]
    assert json.loads(deltas[0].function.arguments) == arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # The result goes back as a tool message; the model answers in text.
    messages = [*WEATHER_CHAT, choice.message, {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=24)
    assert second.choices[0].message.tool_calls is None and second.choices[0].message.content
    server.wait_idle()


def test_openai_client_vllm_fields_batches_and_the_responses_api(client, server, greedy):
    """vLLM's extras in `extra_body` change the real model's output; batch prompts; the Responses API."""
    short = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=64)
    natural = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop"
    longer = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=64,
                                            extra_body={"min_tokens": natural + 4})
    assert longer.usage.completion_tokens >= natural + 4
    forced = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=natural + 6,
                                            extra_body={"ignore_eos": True})
    assert forced.usage.completion_tokens == natural + 6
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, PROMPT], temperature=0, max_tokens=8)
    assert [c.text for c in batch.choices] == [greedy[1], greedy[1]] and [c.index for c in batch.choices] == [0, 1]
    streamed = list(client.completions.create(model=MODEL, prompt=[PROMPT], temperature=0, max_tokens=8,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == greedy[1]
    reply = client.responses.create(model=MODEL, input=CHAT[1]["content"], instructions=CHAT[0]["content"],
                                    temperature=0, max_output_tokens=8)
    assert reply.output_text == greedy[0] and reply.status == "incomplete"
    events = list(client.responses.create(model=MODEL, input=CHAT[1]["content"],
                                          instructions=CHAT[0]["content"], temperature=0, max_output_tokens=8,
                                          stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == greedy[0]
    assert events[-1].type == "response.incomplete"
    server.wait_idle()


def test_tokenize_detokenize_and_continuous_usage_stats_over_http(client, server):
    """vLLM's /tokenize (at the root) counts the chat completion's prompt tokens, /detokenize gives the text
    back, and with continuous_usage_stats each streamed chunk's completion_tokens grows to the final usage."""
    headers = {"Authorization": f"Bearer {server.api_key('tokenizer')}"}
    tokenized = requests.post(f"{server.base_url}/tokenize", json={"model": MODEL, "messages": CHAT}, headers=headers,
                              timeout=120).json()
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=1)
    assert tokenized["count"] == len(tokenized["tokens"]) == reply.usage.prompt_tokens
    text = requests.post(f"{server.base_url}/tokenize", json={"prompt": PROMPT, "return_token_strs": True},
                         headers=headers, timeout=120).json()
    assert len(text["token_strs"]) == text["count"]
    back = requests.post(f"{server.base_url}/detokenize", json={"tokens": text["tokens"]}, headers=headers, timeout=120)
    assert back.json() == {"prompt": PROMPT}
    beyond = requests.post(f"{server.base_url}/detokenize", json={"tokens": [10**6]}, headers=headers, timeout=120)
    assert beyond.status_code == 400 and beyond.json()["error"]["param"] == "tokens"
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, stream=True,
                                            extra_body={"stream_options": {"include_usage": True,
                                                                           "continuous_usage_stats": True}}))
    counts = [c.usage.completion_tokens for c in chunks[:-1]]
    assert counts == sorted(counts) and 0 < counts[-1] == chunks[-1].usage.completion_tokens
    assert {c.usage.prompt_tokens for c in chunks} == {len(text["tokens"])}
    server.wait_idle()
