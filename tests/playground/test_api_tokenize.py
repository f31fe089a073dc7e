"""vLLM's /tokenize and /detokenize (at the root, as vLLM serves them, and under /v1) and
`stream_options.continuous_usage_stats`, over the fake worker (tests/playground/fake_worker.py: one token per
character, a chat template of MESSAGE_OVERHEAD tokens per message). The same on the real model is in
test_api_vllm_engine.py and test_api.py."""
import asyncio
import json

import pytest
from django.contrib.auth.models import User
from django.test import AsyncClient
from fake_engine import MESSAGE_OVERHEAD
from fake_worker import worker

from playground.accounts.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m-instruct"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]


@pytest.fixture
def headers():
    _, secret = ApiKey.objects.issue(User.objects.create(username="tokenizer-client"))
    return {"Authorization": f"Bearer {secret}"}


def post_all(monkeypatch, headers, calls):
    """Each (path, body) posted in turn over the fake worker: (status, parsed body or SSE events) per call, and
    the engine's generation requests."""
    async def scenario():
        async with worker(monkeypatch) as (engine, _):
            client = AsyncClient()
            answers = []
            for path, body in calls:
                raw = body if isinstance(body, bytes) else json.dumps(body)
                response = await client.post(path, raw, content_type="application/json", headers=headers)
                if response.streaming:
                    content = b"".join([chunk async for chunk in response.streaming_content]).decode()
                    answers.append((response.status_code, [json.loads(line[6:]) for line in content.splitlines()
                                                           if line.startswith("data: ") and line != "data: [DONE]"]))
                else:
                    answers.append((response.status_code, json.loads(response.content)))
            return answers, engine.requests

    return asyncio.run(scenario())


def test_tokenize_then_detokenize_gives_the_text_back(monkeypatch, headers):
    text = "Hello, tokenizer!"
    (tokenized, again, plain, text_back, v1), requests = post_all(monkeypatch, headers, [
        ("/tokenize", {"model": MODEL, "prompt": text}),
        ("/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True}),
        ("/v1/tokenize", {"prompt": text, "add_special_tokens": False}),
        ("/detokenize", {"model": MODEL, "tokens": [ord(c) for c in text]}),
        ("/v1/detokenize", {"tokens": [ord(c) for c in text]}),
    ])
    status, body = tokenized
    # vLLM's default for a text prompt adds the tokenizer's special tokens (the fake's: one BOS, id 1).
    assert status == 200 and body == {"count": len(text) + 1, "max_model_len": 2048,
                                      "tokens": [1] + [ord(c) for c in text], "token_strs": None}
    assert again[1]["tokens"] == [ord(c) for c in text] and again[1]["count"] == len(text)
    assert again[1]["token_strs"] == [f"<{c}>" for c in text]  # the tokenizer's own token strings
    assert plain == (200, {**again[1], "token_strs": None})
    assert text_back == (200, {"prompt": text}) and v1 == text_back
    assert requests == []  # the engine never saw them


def test_tokenize_a_chat_counts_the_chat_completions_prompt(monkeypatch, headers):
    (tokenized, completion, prefill, continued), _ = post_all(monkeypatch, headers, [
        ("/tokenize", {"model": MODEL, "messages": CHAT}),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 3}),
        ("/tokenize", {"messages": [*CHAT, {"role": "assistant", "content": "Hel"}], "add_generation_prompt": False,
                       "continue_final_message": True}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [*CHAT, {"role": "assistant", "content": "Hel"}],
                                  "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 3}),
    ])
    assert tokenized[0] == 200 and completion[0] == 200
    assert tokenized[1]["count"] == completion[1]["usage"]["prompt_tokens"] == \
        sum(MESSAGE_OVERHEAD + len(m["content"]) for m in CHAT)
    assert prefill[1]["count"] == continued[1]["usage"]["prompt_tokens"] > tokenized[1]["count"]


@pytest.mark.parametrize("path, body, status, param", [
    ("/detokenize", {"tokens": [72, 1000]}, 400, "tokens"),  # out of the fake's vocabulary (1000 ids)
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "72"}, 400, "tokens"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens"),
    ("/detokenize", {}, 400, "tokens"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "return_token_strs": "yes"}, 400, "return_token_strs"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": 1}, 400, "add_special_tokens"),
    ("/tokenize", {"messages": CHAT, "add_special_tokens": True}, 400, "add_special_tokens"),
    ("/tokenize", {"messages": CHAT, "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "x", "content": "hi"}]}, 400, "messages"),
    ("/tokenize", {"messages": CHAT, "chat_template_kwargs": []}, 400, "chat_template_kwargs"),
    ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
    ("/detokenize", {"model": "nope", "tokens": [1]}, 404, "model"),
    ("/tokenize", b"{not json", 400, None),
])
def test_bad_tokenizer_requests_are_refused_by_name(monkeypatch, headers, path, body, status, param):
    [(got, answer)], _ = post_all(monkeypatch, headers, [(path, body)])
    assert got == status and answer["error"]["param"] == param, answer


@pytest.mark.parametrize("keyless, status", [(True, 200), (False, 401)])
def test_tokenizer_endpoints_take_keys_as_the_other_endpoints(monkeypatch, settings, keyless, status):
    """Keyless from this machine on the embedded default (PLAYGROUND_API_KEYLESS), else a key is needed."""
    settings.PLAYGROUND_API_KEYLESS = keyless
    [(got, answer)], _ = post_all(monkeypatch, {}, [("/tokenize", {"prompt": "ab"})])
    assert got == status and (status == 200 or answer["error"]["code"] == "invalid_api_key")
    assert asyncio.run(AsyncClient().get("/detokenize")).status_code == 405


def usages(events: list[dict]) -> dict[int, list[int]]:
    """Per choice, the completion_tokens of its chunks' usage, in order."""
    counts: dict[int, list[int]] = {}
    for event in events:
        if event["choices"]:
            counts.setdefault(event["choices"][0]["index"], []).append(event["usage"]["completion_tokens"])
    return counts


@pytest.mark.parametrize("endpoint, body", [
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}),
    ("/v1/completions", {"prompt": ["ab", "long prompt"], "n": 2}),
])
def test_continuous_usage_stats_count_each_choice_up_to_the_final_usage(monkeypatch, headers, endpoint, body):
    body = {"model": MODEL, "max_tokens": 30, "stream": True, **body,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    (streamed, plain, without_include), _ = post_all(monkeypatch, headers, [
        (endpoint, body),
        (endpoint, {**body, "stream": False, "stream_options": None}),
        (endpoint, {**body, "stream_options": {"continuous_usage_stats": True}}),
    ])
    status, events = streamed
    assert status == 200 and plain[0] == 200
    final = events[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == plain[1]["usage"]["completion_tokens"]
    assert all("usage" in event for event in events)
    counts = usages(events)
    assert sorted(counts) == [0, 1, 2, 3][: len(plain[1]["choices"])]
    prompts = body.get("prompt")
    for index, seen in counts.items():
        assert seen == sorted(seen) and seen[-1] > 0  # each choice's own count grows to its total
        choice_events = [e for e in events if e["choices"] and e["choices"][0]["index"] == index]
        expected_prompt = (sum(MESSAGE_OVERHEAD + len(m["content"]) for m in CHAT) if prompts is None
                           else len(prompts[index // 2]))
        assert {e["usage"]["prompt_tokens"] for e in choice_events} == {expected_prompt}
        assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
                   for e in choice_events)
    assert sum(seen[-1] for seen in counts.values()) == final["usage"]["completion_tokens"]
    if prompts is None:  # chat opens each choice with its role, before any token (vLLM's 0)
        assert [counts[0][0], counts[1][0]] == [0, 0]
    # vLLM's rule: continuous_usage_stats means nothing without include_usage.
    assert without_include[0] == 200 and not any("usage" in event for event in without_include[1])


def test_continuous_usage_stats_must_be_a_boolean(monkeypatch, headers):
    [(status, answer)], _ = post_all(monkeypatch, headers, [
        ("/v1/completions", {"model": MODEL, "prompt": "ab", "stream": True,
                             "stream_options": {"include_usage": True, "continuous_usage_stats": "yes"}}),
    ])
    assert status == 400 and answer["error"]["param"] == "continuous_usage_stats"
