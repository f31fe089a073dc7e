"""vLLM's request fields and endpoints over the fake worker (tests/playground/fake_worker.py): batch prompts
(text and token ids) with vLLM's choice numbering, echo, unknown fields ignored and named in X-Ignored-Fields,
known-but-unsupported fields refused by name, the fields that reach the engine's SamplingParams and the
envelope, the Responses API plain and streamed, /health, /version and /v1/models. Behaviour that needs the
model (min_tokens, ignore_eos...) is in test_api_vllm_engine.py."""
import asyncio
import json
import time

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import AsyncClient
from fake_engine import SILENT_TOKENS
from fake_worker import worker

from playground.accounts.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m-instruct"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def headers():
    _, secret = ApiKey.objects.issue(User.objects.create(username="vllm-client"))
    return {"Authorization": f"Bearer {secret}"}


def post_all(monkeypatch, headers, calls):
    """Each (path, body) posted in turn over the fake worker; the responses and the engine's requests."""
    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            client = AsyncClient()
            answers = []
            for path, body in calls:
                response = await client.post(path, body, content_type="application/json", headers=headers)
                content = (b"".join([chunk async for chunk in response.streaming_content])
                           if response.streaming else response.content)
                answers.append((response, content))
            return answers, engine.requests, submitted

    return asyncio.run(scenario())


def events(content: bytes) -> list:
    return [json.loads(line[6:]) for line in content.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_batch_prompts_text_and_token_ids_number_choices_as_vllm(monkeypatch, headers):
    body = {"model": MODEL, "prompt": ["ab", "cd"], "n": 2, "max_tokens": 20, "temperature": 0}
    answers, requests, _ = post_all(monkeypatch, headers, [
        ("/v1/completions", body),
        ("/v1/completions", {**body, "prompt": [[5, 6], [7]], "n": 1}),
        ("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}),
    ])
    plain = json.loads(answers[0][1])
    assert [(c["index"], c["text"]) for c in plain["choices"]] == [(0, "echo0: ab"), (1, "echo1: ab"),
                                                                    (2, "echo0: cd"), (3, "echo1: cd")]
    assert plain["usage"]["prompt_tokens"] == 4 and plain["usage"]["completion_tokens"] == 4 * 9
    ids = json.loads(answers[1][1])
    assert [c["text"] for c in ids["choices"]] == ["echo0: 5 6", "echo0: 7"]
    assert sorted(map(str, (r["prompt"] for r in requests[:4]))) == ["[5, 6]", "[7]", "ab", "cd"]  # one per prompt
    chunks = events(answers[2][1])
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "echo0: ab", 1: "echo1: ab", 2: "echo0: cd", 3: "echo1: cd"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 36


def test_echo_prefixes_the_prompt_plain_and_streamed(monkeypatch, headers):
    body = {"model": MODEL, "prompt": "Say", "echo": True, "max_tokens": 20}
    answers, _, _ = post_all(monkeypatch, headers, [("/v1/completions", body),
                                                    ("/v1/completions", {**body, "stream": True})])
    assert json.loads(answers[0][1])["choices"][0]["text"] == "Sayecho0: Say"
    assert "".join(c["choices"][0]["text"] for c in events(answers[1][1])) == "Sayecho0: Say"


def test_unknown_fields_are_ignored_and_named_in_a_header(monkeypatch, headers):
    answers, requests, _ = post_all(monkeypatch, headers, [
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 3, "frobnicate": 1, "guided_x": {}}),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 3}),
    ])
    assert answers[0][0].status_code == 200 and answers[0][0]["X-Ignored-Fields"] == "frobnicate, guided_x"
    assert "X-Ignored-Fields" not in answers[1][0]
    assert len(requests) == 2


@pytest.mark.parametrize("body, param", [
    ({"logit_bias": [5, 10]}, "logit_bias"),
    ({"logit_bias": {"five": 10}}, "logit_bias"),
    ({"logit_bias": {"-1": 10}}, "logit_bias"),
    ({"logit_bias": {"1.5": 10}}, "logit_bias"),
    ({"logit_bias": {"5": "high"}}, "logit_bias"),
    ({"logit_bias": {"5": True}}, "logit_bias"),
    ({"logit_bias": {"5": None}}, "logit_bias"),
    ({"logit_bias": {"5": 1, "1000": 1}}, "logit_bias"),  # past the (fake) vocabulary: the worker's refusal
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),  # vLLM's "the whole vocabulary": refused here
    ({"prompt_logprobs": "2"}, "prompt_logprobs"),
    ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
    ({"prompt_logprobs": True}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),  # vLLM refuses them in a stream too
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"continue_final_message": True}, "continue_final_message"),  # the last message is the user's
    ({"continue_final_message": True, "add_generation_prompt": True,
      "messages": [*CHAT, {"role": "assistant", "content": "Sure"}]}, "continue_final_message"),
    ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
    ({"truncate_prompt_tokens": -1}, "truncate_prompt_tokens"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_known_but_unsupported_values_are_refused_by_name(monkeypatch, headers, body, param):
    answers, requests, _ = post_all(monkeypatch, headers,
                                    [("/v1/chat/completions", {"model": MODEL, "messages": CHAT, **body})])
    response, content = answers[0]
    assert response.status_code == 400 and json.loads(content)["error"]["param"] == param
    assert param.split(".")[0] in json.loads(content)["error"]["message"] or param == "messages"
    assert requests == []


def test_logit_bias_and_prompt_logprobs_reach_the_engine_and_come_back_as_vllm_s(monkeypatch, headers):
    """logit_bias: integer-string keys, each bias clamped to [-100, 100]; prompt_logprobs: each completion
    choice carries its own prompt's, a chat response has them beside its choices (vLLM's places)."""
    body = {"model": MODEL, "prompt": ["abc", "xy"], "n": 2, "max_tokens": 4, "echo": True, "prompt_logprobs": 1,
            "logit_bias": {"5": 250, "07": -3.5}}
    answers, requests, _ = post_all(monkeypatch, headers, [
        ("/v1/completions", body),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 4, "prompt_logprobs": 0}),
        ("/v1/completions", {"model": MODEL, "prompt": "ab", "max_tokens": 2, "stream": True, "prompt_logprobs": 0}),
        ("/v1/completions", {"model": MODEL, "prompt": "ab", "max_tokens": 2}),
    ])
    params = requests[0]["params"]
    assert params.logit_bias == {5: 100.0, 7: -3.5} and params.prompt_logprobs == 1
    completion = json.loads(answers[0][1])
    expected = {"abc": [None, {"98": {"logprob": -1.0, "rank": 1, "decoded_token": "b"}},
                        {"99": {"logprob": -2.0, "rank": 1, "decoded_token": "c"}}],
                "xy": [None, {"121": {"logprob": -1.0, "rank": 1, "decoded_token": "y"}}]}
    assert [c["prompt_logprobs"] for c in completion["choices"]] == [expected["abc"]] * 2 + [expected["xy"]] * 2
    assert [c["text"] for c in completion["choices"]][::2] == ["abcecho", "xyecho"]  # echo keeps working
    chat = json.loads(answers[1][1])
    assert chat["prompt_logprobs"] == [None, {"105": {"logprob": -1.0, "rank": 1, "decoded_token": "i"}}]
    assert "prompt_logprobs" not in chat["choices"][0]
    assert answers[2][0].status_code == 200 and "prompt_logprobs" not in answers[2][1].decode()
    assert "prompt_logprobs" not in json.loads(answers[3][1])["choices"][0]
    assert requests[3]["params"].prompt_logprobs is None  # a stream returns none: none are computed
    assert requests[4]["params"].logit_bias is None and requests[4]["params"].prompt_logprobs is None


def test_best_of_above_n_is_refused(monkeypatch, headers):
    answers, requests, _ = post_all(monkeypatch, headers,
                                    [("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 2})])
    assert answers[0][0].status_code == 400 and json.loads(answers[0][1])["error"]["param"] == "best_of"


def test_vllm_fields_reach_the_engine(monkeypatch, headers):
    """Each field lands in SamplingParams or the envelope under vLLM's name (their effect: the engine tests)."""
    answers, requests, submitted = post_all(monkeypatch, headers, [
        ("/v1/chat/completions", {"model": MODEL, "max_tokens": 8, "min_tokens": 3, "ignore_eos": True,
                                  "stop_token_ids": [2], "include_stop_str_in_output": True,
                                  "skip_special_tokens": False, "repetition_penalty": 1.2, "top_k": 5, "min_p": 0.1,
                                  "seed": 7, "chat_template_kwargs": {"flag": True},
                                  "messages": [{"role": "developer", "content": "Be brief."},
                                               {"role": "user", "content": [{"type": "text", "text": "Say "},
                                                                            {"type": "text", "text": "yes"}],
                                                "name": "ann"},
                                               {"role": "assistant", "content": "Yes"}],
                                  "continue_final_message": True, "echo": True}),
    ])
    params = requests[0]["params"]
    assert (params.min_tokens, params.ignore_eos, params.stop_token_ids, params.include_stop_str_in_output,
            params.skip_special_tokens) == (3, True, [2], True, False)
    assert (params.repetition_penalty, params.top_k, params.min_p, params.seed) == (1.2, 5, 0.1, 7)
    job = submitted[0]["job"]
    assert job.chat_template_kwargs == {"flag": True}
    assert (job.add_generation_prompt, job.continue_final_message) == (False, True)
    assert job.messages == [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Say yes", "name": "ann"},
                            {"role": "assistant", "content": "Yes"}]
    # echo with continue_final_message: the reply starts with the message it continues
    assert json.loads(answers[0][1])["choices"][0]["message"]["content"] == "Yes" + "echo0: Yes"[:8]


def test_responses_api_plain_and_streamed(monkeypatch, headers):
    body = {"model": MODEL, "input": "hello", "instructions": "Be brief.", "max_output_tokens": 4, "store": False}
    answers, requests, _ = post_all(monkeypatch, headers, [
        ("/v1/responses", body),
        ("/v1/responses", {**body, "max_output_tokens": 50, "stream": True,
                           "input": [{"role": "user", "content": [{"type": "input_text", "text": "yo"}]}]}),
        ("/v1/responses", {**body, "tools": [{"type": "web_search"}]}),
        ("/v1/responses", {**body, "previous_response_id": "resp_1"}),
    ])
    plain = json.loads(answers[0][1])
    assert plain["object"] == "response" and plain["status"] == "incomplete"
    assert plain["incomplete_details"] == {"reason": "max_output_tokens"}
    assert plain["output"][0]["content"][0] == {"type": "output_text", "text": "echo", "annotations": [],
                                                "logprobs": []}
    assert plain["usage"]["output_tokens"] == 4 and plain["instructions"] == "Be brief."
    assert requests[0]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    streamed = events(answers[1][1])
    kinds = [e["type"] for e in streamed]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    deltas = "".join(e["delta"] for e in streamed if e["type"] == "response.output_text.delta")
    assert deltas == streamed[-1]["response"]["output"][0]["content"][0]["text"] == "echo0: yo"
    assert [json.loads(a[1])["error"]["param"] for a in answers[2:]] == ["tools", "previous_response_id"]


def test_health_version_and_models(monkeypatch, headers, settings):
    cache.clear()  # no heartbeat left by an earlier test's worker

    async def scenario():
        client = AsyncClient()
        before = await client.get("/health")
        async with worker(monkeypatch):
            during = await client.get("/health")
            models = await client.get("/v1/models", headers=headers)
        return before, during, models, await client.get("/version")

    before, during, models, version = asyncio.run(scenario())
    assert before.status_code == 503 and during.status_code == 200
    assert version.json()["version"]
    card = models.json()["data"][0]
    # The worker's engine's own window (the fake engine's 2,048), as its heartbeat reports it; nothing configured.
    assert settings.PLAYGROUND_ENGINE["max_model_len"] is None
    assert card["max_model_len"] == 2048 and card["root"] == MODEL


def test_the_models_suggested_sampling_fills_the_fields_a_request_leaves_unset(monkeypatch, headers, settings):
    """As vLLM's server applies generation_config.json: its suggestions (reported by the worker's heartbeat)
    are the defaults of the fields a request leaves out, within the API's caps; fields the request sets win."""
    cache.clear()
    suggested = {"temperature": 0.3, "top_k": 20, "repetition_penalty": 1.1, "max_tokens": 10**6}

    async def scenario():
        async with worker(monkeypatch, suggested_sampling=suggested) as (engine, _):
            client = AsyncClient()
            for body in ({"messages": [{"role": "user", "content": "hi"}]},
                         {"messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "max_tokens": 5}):
                response = await client.post("/v1/chat/completions", {"model": MODEL, **body},
                                             content_type="application/json", headers=headers)
                assert response.status_code == 200, response.content
            return engine.requests

    unset, explicit = [r["params"] for r in asyncio.run(scenario())]
    caps = settings.PLAYGROUND_LIMITS
    assert (unset.temperature, unset.top_k, unset.repetition_penalty) == (0.3, 20, 1.1)
    assert unset.max_tokens == caps["max_tokens"]  # a suggestion above the cap is lowered to it
    assert (explicit.temperature, explicit.max_tokens, explicit.top_k) == (1.0, 5, 20)


def test_a_stream_opens_at_the_first_token_even_when_it_has_no_text(monkeypatch, headers):
    """As vLLM's server: the role chunk leaves with the first token, not with the first text. Here the first
    SILENT_TOKENS tokens have no text (special tokens); the role chunk and an empty delta arrive about that many
    steps before the reply's first character, and the usage counts those tokens."""
    delay = 0.03
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "SILENT hi"}], "max_tokens": 64,
                       "stream": True, "stream_options": {"include_usage": True}})

    async def scenario():
        async with worker(monkeypatch, delay=delay):
            response = await AsyncClient().post("/v1/chat/completions", body, content_type="application/json",
                                                headers=headers)
            return [(time.monotonic(), event) async for chunk in response.streaming_content
                    for event in events(chunk)]

    stamped = asyncio.run(scenario())
    deltas = [(at, e["choices"][0]["delta"]) for at, e in stamped if e["choices"]]
    assert deltas[0][1] == {"role": "assistant", "content": ""} and deltas[1][1] == {"content": ""}
    first_text_at = next(at for at, delta in deltas if delta.get("content"))
    assert first_text_at - deltas[0][0] >= (SILENT_TOKENS - 3) * delay
    assert "".join(delta.get("content", "") for _, delta in deltas) == "echo0: SILENT hi"
    assert stamped[-1][1]["usage"]["completion_tokens"] == SILENT_TOKENS + len("echo0: SILENT hi")
