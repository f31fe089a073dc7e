"""LoRA adapters on the web side (PLAYGROUND_LORA_MODULES): /v1/models lists them, `model` selects one on the
API and on the chat socket, and the worker hands the engine that adapter's LoRARequest; an unknown name is a
404 / an error frame and reaches no worker. Over the fake worker (tests/playground/fake_worker.py)."""
import asyncio

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient
from fake_worker import connect, generate, until_end, worker

from inference import LoRARequest
from playground.accounts.models import ApiKey
from playground.envconfig import env_lora_modules

pytestmark = pytest.mark.django_db(transaction=True)
BASE = "smollm2-135m-instruct"
MODULES = {"sql-lora": "/adapters/sql", "poem-lora": "/adapters/poem"}


@pytest.fixture(autouse=True)
def adapters(settings):
    settings.PLAYGROUND_LORA_MODULES = MODULES


@pytest.fixture
def api_key():
    _, secret = ApiKey.objects.issue(User.objects.create(username="client"))
    return secret


def test_lora_modules_are_parsed_in_order_and_checked(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_LORA_MODULES", "sql-lora=/a/sql, poem-lora = /a/poem")
    assert list(env_lora_modules("PLAYGROUND_LORA_MODULES", BASE).items()) == [("sql-lora", "/a/sql"),
                                                                              ("poem-lora", "/a/poem")]
    for bad in ("sql-lora", "=/a", "a=/x,a=/y", f"{BASE}=/x"):
        monkeypatch.setenv("PLAYGROUND_LORA_MODULES", bad)
        with pytest.raises(ImproperlyConfigured, match="PLAYGROUND_LORA_MODULES"):
            env_lora_modules("PLAYGROUND_LORA_MODULES", BASE)
    monkeypatch.delenv("PLAYGROUND_LORA_MODULES")
    assert env_lora_modules("PLAYGROUND_LORA_MODULES", BASE) == {}


def test_models_lists_the_base_model_and_each_adapter(api_key):
    async def get():
        return await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {api_key}"})

    data = asyncio.run(get()).json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [(BASE, None), ("sql-lora", BASE), ("poem-lora", BASE)]


def test_api_model_selects_the_adapter_on_both_endpoints(monkeypatch, api_key):
    headers = {"Authorization": f"Bearer {api_key}"}
    bodies = [("/v1/chat/completions", {"model": "poem-lora", "messages": [{"role": "user", "content": "hi"}]}),
              ("/v1/completions", {"model": "sql-lora", "prompt": "SELECT"}),
              ("/v1/completions", {"model": BASE, "prompt": "plain"})]

    async def scenario():
        async with worker(monkeypatch, lora_modules=MODULES) as (engine, submitted):
            client = AsyncClient()
            statuses = [(await client.post(path, body, content_type="application/json", headers=headers)).status_code
                        for path, body in bodies]
            unknown = await client.post("/v1/completions", {"model": "nope", "prompt": "x"},
                                        content_type="application/json", headers=headers)
            return statuses, unknown, engine.requests, submitted

    statuses, unknown, requests, submitted = asyncio.run(scenario())
    assert statuses == [200, 200, 200]
    assert [r["lora_request"] for r in requests] == [LoRARequest("poem-lora", 2, "/adapters/poem"),
                                                     LoRARequest("sql-lora", 1, "/adapters/sql"), None]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert len(submitted) == 3  # the unknown model reached no worker


def test_socket_model_selects_the_adapter_and_an_unknown_one_is_an_error_frame(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, lora_modules=MODULES) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to({**generate(max_tokens=8), "model": "sql-lora"})
            adapted = await until_end(ws)
            await ws.send_json_to(generate(max_tokens=8))
            base = await until_end(ws)
            await ws.send_json_to({**generate(max_tokens=8), "model": "nope"})
            unknown = await ws.receive_json_from(timeout=5)
            await ws.send_json_to({**generate(max_tokens=8), "model": 7})
            not_a_name = await ws.receive_json_from(timeout=5)
            await ws.disconnect()
            return adapted, base, unknown, not_a_name, engine.requests, submitted

    adapted, base, unknown, not_a_name, requests, submitted = asyncio.run(scenario())
    assert adapted[-1]["type"] == base[-1]["type"] == "done"
    assert [r["lora_request"] for r in requests] == [LoRARequest("sql-lora", 1, "/adapters/sql"), None]
    assert unknown == {"type": "error", "message": "the model 'nope' does not exist; this server serves "
                                                   f"{BASE}, sql-lora, poem-lora"}
    assert not_a_name["type"] == "error" and "model must be" in not_a_name["message"]
    assert len(submitted) == 2


def test_a_worker_without_the_adapter_refuses_it_as_a_bad_request(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, lora_modules={}) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to({**generate(max_tokens=8), "model": "sql-lora"})
            frames = await until_end(ws)
            await ws.send_json_to(generate(max_tokens=8))
            after = await until_end(ws)
            await ws.disconnect()
            return frames, after

    frames, after = asyncio.run(scenario())
    assert frames[-1]["type"] == "error" and "unknown LoRA adapter 'sql-lora'" in frames[-1]["message"]
    assert after[-1]["type"] == "done"  # the worker keeps serving


@pytest.mark.parametrize("modules, listed", [({}, [BASE]), (MODULES, [BASE, "sql-lora", "poem-lora"])])
def test_chat_page_offers_the_served_models(client, settings, modules, listed):
    settings.PLAYGROUND_LORA_MODULES = modules
    response = client.get("/")
    assert response.context["chat_config"]["models"] == listed
    assert 'id="model-picker"' in response.content.decode()  # shown by main.js when there is a choice


def test_the_served_window_is_the_smallest_live_workers_else_the_configured_one(settings):
    """Each worker resolves its own max_model_len (from the model and its KV pool unless configured) and its
    heartbeat carries it; the page's meter and /v1/models state the smallest, since any worker may serve."""
    from django.core.cache import cache

    from playground.serving.shared import registry
    from playground.serving.web.models import served_max_model_len

    cache.clear()
    settings.PLAYGROUND_ENGINE = {**settings.PLAYGROUND_ENGINE, "max_model_len": None}
    assert served_max_model_len() is None  # nothing loaded yet, nothing configured: the page says so
    registry.beat({"name": "loading", "max_model_len": None})
    settings.PLAYGROUND_ENGINE = {**settings.PLAYGROUND_ENGINE, "max_model_len": 1024}
    assert served_max_model_len() == 1024
    registry.beat({"name": "a", "max_model_len": 8192})
    registry.beat({"name": "b", "max_model_len": 4096})
    assert served_max_model_len() == 4096
    registry.forget("b")
    assert served_max_model_len() == 8192
    cache.clear()
