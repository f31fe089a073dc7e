"""The official `openai` client against the API, in process (the ASGI application over httpx, the fake worker
of fake_worker.py): chat and completions with batch prompts, streaming, vLLM's fields sent in `extra_body`
reaching the engine, unknown ones reported, the Responses API plain and streamed. (test_api.py runs the client
against the live embedded server with the real model, test_api_vllm_engine.py shows the fields' effects.)"""
import asyncio

import httpx2 as httpx  # the HTTP library this openai release is built on
import openai
import pytest
from django.contrib.auth.models import User
from fake_worker import worker

from playground.accounts.models import ApiKey
from playground.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-135m-instruct"


def with_client(monkeypatch, scenario):
    _, secret = ApiKey.objects.issue(User.objects.create(username="openai-client"))

    async def run():
        async with worker(monkeypatch) as (engine, _):
            http = httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://testserver")
            client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=secret, http_client=http,
                                        max_retries=0)
            try:
                return await scenario(client), engine.requests
            finally:
                await http.aclose()

    return asyncio.run(run())


def test_completions_batch_plain_and_streamed(monkeypatch):
    async def scenario(client):
        plain = await client.completions.create(model=MODEL, prompt=["ab", "cd"], max_tokens=20, temperature=0)
        stream = await client.completions.create(model=MODEL, prompt=[[1, 2], "ef"], max_tokens=20, stream=True)
        texts: dict[int, str] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
        return plain, texts

    (plain, texts), _ = with_client(monkeypatch, scenario)
    assert [c.text for c in plain.choices] == ["echo0: ab", "echo0: cd"] and plain.usage.completion_tokens == 18
    assert texts == {0: "echo0: 1 2", 1: "echo0: ef"}


def test_chat_streaming_and_extra_body(monkeypatch):
    async def scenario(client):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=6,
            extra_body={"min_tokens": 2, "ignore_eos": True, "top_k": 3, "not_a_field": 1})
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "yo"}],
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        return raw, chunks

    (raw, chunks), requests = with_client(monkeypatch, scenario)
    assert raw.headers["x-ignored-fields"] == "not_a_field"
    assert raw.parse().choices[0].message.content == "echo0:"
    params = requests[0]["params"]
    assert (params.min_tokens, params.ignore_eos, params.top_k, params.max_tokens) == (2, True, 3, 6)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo0: yo"
    assert chunks[-1].usage.completion_tokens == 9


def test_responses_api_plain_and_streamed(monkeypatch):
    async def scenario(client):
        plain = await client.responses.create(model=MODEL, input="hello", instructions="Be brief.")
        events = [e async for e in await client.responses.create(model=MODEL, input="hey", stream=True)]
        return plain, events

    (plain, events), requests = with_client(monkeypatch, scenario)
    assert plain.output_text == "echo0: hello" and plain.status == "completed" and plain.usage.output_tokens == 12
    assert requests[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "echo0: hey"
    assert events[-1].response.output_text == "echo0: hey"
