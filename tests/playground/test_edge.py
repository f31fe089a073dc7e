"""Every bad input answered at the edge, for the OpenAI API (chat and completions, streaming or not) and
the edge's own rules: unpaired surrogates and NUL (which the API alone takes), JSON nested 50,000 deep, oversize bodies. Each gets a
clear HTTP 400/413 naming the problem; nothing reaches a worker, no slot is taken. (The chat socket's bad
frames: test_consumer.py; over the real server: test_web_server.py.)"""
import asyncio
import json
import time

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import AsyncClient

from fake_worker import worker

from playground.accounts.models import ApiKey
from playground.serving.web import dispatch
from playground.serving.web.edge import InvalidInput, nesting_depth, parse_json_object

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 50_000 + "]" * 50_000
BAD_TEXTS = {"surrogate": "hi \ud800", "low surrogate": "\udfff!", "nul": "a\x00b"}
SURROGATES = {name: text for name, text in BAD_TEXTS.items() if name != "nul"}


def as_json(value) -> str:
    """JSON as a client writes it: a lone surrogate travels as the escape \\ud800 (valid UTF-8 on the wire)."""
    return json.dumps(value)


def test_nesting_is_measured_before_parsing_and_ignores_brackets_in_strings():
    assert nesting_depth('{"a": [1, {"b": []}]}') == 4
    assert nesting_depth('{"a": "[[[[[[\\"[[["}') == 1
    started = time.monotonic()
    with pytest.raises(InvalidInput, match="deeper than 32 levels"):
        parse_json_object(DEEP, 10**6, 32)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("name", BAD_TEXTS)
def test_invalid_unicode_is_refused_naming_where_it_is(name):
    text = BAD_TEXTS[name]
    with pytest.raises(InvalidInput, match=r"messages\[0\]\.content contains"):
        parse_json_object(as_json({"messages": [{"content": text}]}), 10**6, 32)
    with pytest.raises(InvalidInput, match="a field name in params contains"):
        parse_json_object(as_json({"params": {text: 1}}), 10**6, 32)
    if name in SURROGATES:  # the API's parse takes NUL, never a lone surrogate
        with pytest.raises(InvalidInput, match=r"messages\[0\]\.content contains an unpaired surrogate"):
            parse_json_object(as_json({"messages": [{"content": text}]}), 10**6, 32, allow_nul=True)
    else:
        assert parse_json_object(as_json({"prompt": text}), 10**6, 32, allow_nul=True) == {"prompt": text}


@pytest.fixture
def api_key():
    _, secret = ApiKey.objects.issue(User.objects.create(username="client"))
    return secret


def api_post(path: str, body: str | bytes, key: str):
    async def post():
        return await AsyncClient().post(path, body, content_type="application/json",
                                        headers={"Authorization": f"Bearer {key}"})

    return asyncio.run(post())


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", SURROGATES)
def test_api_refuses_invalid_unicode_with_400_streaming_or_not(monkeypatch, api_key, name, stream):
    monkeypatch.setattr(dispatch, "submit_many", lambda jobs: pytest.fail("a bad body reached dispatch"))
    text = BAD_TEXTS[name]
    chat = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": text}], "stream": stream}
    completion = {"model": "smollm2-135m-instruct", "prompt": text, "stream": stream}
    for path, body, where in [("/v1/chat/completions", chat, "messages[0].content"),
                              ("/v1/completions", completion, "prompt")]:
        response = api_post(path, as_json(body), api_key)
        assert response.status_code == 400, response.content
        error = json.loads(response.content)["error"]
        assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{where} contains")
    assert not cache.get(f"limits:conc:user:{User.objects.get(username='client').pk}")  # no slot was taken


def test_api_takes_a_nul_as_vllm_does_and_the_engine_sees_it(monkeypatch, api_key):
    """SmolLM2's vocabulary has a token for NUL, and vLLM's random benchmark dataset sends it: the API (which
    stores nothing of a request) passes it to the engine; only the chat socket, whose messages are stored,
    refuses it."""
    async def scenario():
        async with worker(monkeypatch) as (engine, _):
            response = await AsyncClient().post(
                "/v1/completions", as_json({"model": "smollm2-135m-instruct", "prompt": "a\x00b", "max_tokens": 50}),
                content_type="application/json", headers={"Authorization": f"Bearer {api_key}"})
            return response, engine.requests

    response, requests = asyncio.run(scenario())
    assert response.status_code == 200, response.content
    assert requests[-1]["prompt"] == "a\x00b"
    assert json.loads(response.content)["choices"][0]["text"] == "echo0: a\x00b"


def test_api_refuses_deep_nesting_with_400_and_a_large_body_with_413(api_key, settings):
    response = api_post("/v1/chat/completions", DEEP, api_key)
    assert response.status_code == 400 and "deeper than 32 levels" in json.loads(response.content)["error"]["message"]
    big = b'{"model": "x", "pad": "' + b"x" * (settings.PLAYGROUND_API["max_body_bytes"] + 1) + b'"}'
    response = api_post("/v1/completions", big, api_key)
    assert response.status_code == 413 and json.loads(response.content)["error"]["code"] == "request_too_large"
