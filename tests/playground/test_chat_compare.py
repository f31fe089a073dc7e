"""The chat socket's compare frame (docs/protocol.md): one prompt answered under settings A and B at once, each
side a full generation of the one lifecycle (admit -> submit -> stream -> finish / abort / fail -> release),
admitted both or neither, validated by the same rules as a generate frame, and saved nowhere. Over the fake
worker (tests/playground/fake_worker.py), whose engine answers "echo<i>: <last message>" one character a token.
"""
import asyncio
import json

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache
from fake_worker import ASK, connect, generate, until_end, worker
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inference import LoRARequest
from playground.accounts import limits
from playground.chat.models import Conversation
from playground.chat.protocol import Compare, parse_frame
from playground.serving.web import sampling
from playground.serving.web.edge import InvalidInput

pytestmark = pytest.mark.django_db(transaction=True)


def compare(a: dict, b: dict, messages=ASK, side_b: dict | None = None) -> dict:
    """A compare frame: A's and B's params, and B's other fields (`side_b`: model, response_format)."""
    return {"type": "compare", "messages": messages, "sides": [{"params": a}, {"params": b, **(side_b or {})}]}


async def until_both_end(ws, request_ids: list[str], timeout: float = 5) -> list[dict]:
    """Frames until each of `request_ids` has had its done or error."""
    frames, open_ = [], set(request_ids)
    while open_:
        frame = await ws.receive_json_from(timeout=timeout)
        frames.append(frame)
        if frame["type"] in ("done", "error"):
            open_.discard(frame.get("request_id"))
    return frames


def per_request(frames: list[dict], request_id: str) -> tuple[str, dict]:
    """What streamed for `request_id` and its last frame."""
    mine = [f for f in frames if f.get("request_id") == request_id]
    return "".join(f["text"] for f in mine if f["type"] == "token"), mine[-1]


def test_both_sides_stream_at_once_each_with_its_settings_and_receipt_and_nothing_is_saved(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.01) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to(compare({"temperature": 0, "max_tokens": 5},
                                          {"temperature": 1.3, "seed": 7, "max_tokens": 12}))
            started = await ws.receive_json_from(timeout=5)
            frames = await until_both_end(ws, started["request_ids"])
            await ws.disconnect()
            return started, frames, engine.requests, engine.encode_chat, submitted

    started, frames, requests, encode_chat, submitted = asyncio.run(scenario())
    assert started["type"] == "compare_started" and len(set(started["request_ids"])) == 2
    a, b = started["request_ids"]
    (text_a, done_a), (text_b, done_b) = per_request(frames, a), per_request(frames, b)
    assert (text_a, done_a["outputs"][0]["text"]) == ("echo0", "echo0")
    assert (text_b, done_b["outputs"][0]["text"]) == ("echo0: hi th", "echo0: hi th")
    assert done_a["outputs"][0]["finish_reason"] == done_b["outputs"][0]["finish_reason"] == "length"
    for done, completion in ((done_a, 5), (done_b, 12)):
        assert done["type"] == "done" and done["usage"]["completion_tokens"] == completion
        assert done["receipt"]["recomputed_tokens"] >= 0 and done["timing"]["tokens_per_s"] > 0
        assert "conversation_id" not in done and "message_id" not in done  # not saved
    # Both streamed at once: B's first token came before A's done.
    order = [(f["type"], f["request_id"]) for f in frames]
    assert order.index(("token", b)) < order.index(("done", a))
    # Each side reached the engine with its own settings, over the same transcript, fitted to the window.
    by_id = {r["request_id"]: r["params"] for r in requests}
    assert (by_id[a].temperature, by_id[a].max_tokens, by_id[a].seed) == (0.0, 5, None)
    assert (by_id[b].temperature, by_id[b].max_tokens, by_id[b].seed) == (1.3, 12, 7)
    assert [r["prompt"] for r in requests] == [encode_chat(ASK)] * 2
    assert all(s["fit_window"] and s["preferred_worker"] == "" for s in submitted)
    assert Conversation.objects.count() == 0


@pytest.mark.parametrize("frame, message", [
    (compare({"max_tokens": 8}, {"temperature": 9}), "B: params.temperature must be in [0.0, 2.0], got 9"),
    (compare({"top_p": 0}, {}), "A: params.top_p must be in (0.0, 1.0], got 0"),
    (compare({}, {"tempreature": 1}), "B: unknown field(s) in params: tempreature"),
    (compare({}, {}, side_b={"model": "nope"}), "the model 'nope' does not exist; this server serves smollm2-135m-instruct"),
    (compare({}, {}, side_b={"colour": "red"}), "B: unknown field(s): colour"),
    (compare({}, {}, side_b={"response_format": {"type": "yaml"}}), "B: response_format"),
    ({"type": "compare", "messages": ASK, "sides": [{"params": {}}]}, "sides must be a list of two objects"),
    ({"type": "compare", "messages": ASK, "sides": [{}, "B"]}, "B: must be an object"),
    ({**compare({}, {}), "conversation_id": None}, "unknown field(s) in compare: conversation_id"),
    (compare({}, {}, messages=[{"role": "assistant", "content": "hi"}]), "the last message must have role 'user'"),
])
def test_a_bad_side_is_an_error_naming_the_side_and_the_field_and_nothing_is_queued(monkeypatch, frame, message):
    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to(frame)
            refused = await ws.receive_json_from(timeout=5)
            await ws.send_json_to(generate(max_tokens=4))  # the socket still serves
            after = await until_end(ws)
            await ws.disconnect()
            return refused, after, submitted

    refused, after, submitted = asyncio.run(scenario())
    assert refused["type"] == "error" and "request_id" not in refused
    assert refused["message"].startswith(message)
    assert after[-1]["type"] == "done" and len(submitted) == 1


def test_a_limit_of_one_stream_refuses_compare_clearly_and_keeps_no_slot(monkeypatch, settings):
    settings.PLAYGROUND_ANONYMOUS_LIMITS = {"max_concurrent_requests_per_address": 1,
                                            "tokens_per_minute_per_address": 0, "max_concurrent_requests": 0}

    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to(compare({"max_tokens": 4}, {"max_tokens": 6}))
            refused = await ws.receive_json_from(timeout=5)
            held = cache.get(f"limits:conc:{limits.anonymous_identity('')}")
            await ws.send_json_to(generate(max_tokens=4))  # the one slot is free: a plain reply is served
            after = await until_end(ws)
            await ws.disconnect()
            return refused, held, after, submitted

    refused, held, after, submitted = asyncio.run(scenario())
    assert refused == {"type": "error", "message": "compare streams two replies at once and needs two request slots: "
                                                   "too many concurrent requests: at most 1 at once; wait for one to "
                                                   "finish"}
    assert held == 0  # A's slot was given back as B was refused
    assert [f["type"] for f in after if f["type"] != "token"] == ["started", "done"]
    assert len(submitted) == 1
    assert cache.get(f"limits:conc:{limits.anonymous_identity('')}") == 0


def test_stop_cancels_both_sides_and_each_ends_with_its_partial_text(monkeypatch):
    long_ask = [{"role": "user", "content": "z" * 400}]

    async def scenario():
        async with worker(monkeypatch, delay=0.03) as (engine, _):
            ws = await connect()
            await ws.send_json_to(compare({"max_tokens": 400}, {"max_tokens": 400, "temperature": 1}, long_ask))
            started = await ws.receive_json_from(timeout=5)
            first = await ws.receive_json_from(timeout=5)
            for request_id in started["request_ids"]:
                await ws.send_json_to({"type": "cancel", "request_id": request_id})
            frames = await until_both_end(ws, started["request_ids"])
            await ws.disconnect()
            return started, [first, *frames], engine

    started, frames, engine = asyncio.run(scenario())
    assert sorted(engine.aborted) == sorted(started["request_ids"]) and not engine.live
    for request_id in started["request_ids"]:
        streamed, done = per_request(frames, request_id)
        assert done["type"] == "done" and done["outputs"][0]["finish_reason"] == "abort"
        assert done["outputs"][0]["text"] == streamed and len(streamed) < 100


def test_closing_the_socket_aborts_both_sides(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.03) as (engine, _):
            ws = await connect()
            await ws.send_json_to(compare({"max_tokens": 400}, {"max_tokens": 400}, [{"role": "user", "content": "w" * 400}]))
            started = await ws.receive_json_from(timeout=5)
            await ws.receive_json_from(timeout=5)  # a first token: the engine runs them
            await ws.disconnect()
            for _ in range(100):
                if not engine.live:
                    break
                await asyncio.sleep(0.02)
            return started, engine

    started, engine = asyncio.run(scenario())
    assert sorted(engine.aborted) == sorted(started["request_ids"]) and not engine.live


def test_base_model_against_an_adapter(monkeypatch, settings):
    settings.PLAYGROUND_LORA_MODULES = {"sql-lora": "/adapters/sql"}

    async def scenario():
        async with worker(monkeypatch, lora_modules=settings.PLAYGROUND_LORA_MODULES) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to(compare({"max_tokens": 8}, {"max_tokens": 8}, side_b={"model": "sql-lora"}))
            started = await ws.receive_json_from(timeout=5)
            frames = await until_both_end(ws, started["request_ids"])
            await ws.disconnect()
            return started, frames, engine.requests

    started, frames, requests = asyncio.run(scenario())
    a, b = started["request_ids"]
    assert {r["request_id"]: r["lora_request"] for r in requests} == {a: None,
                                                                      b: LoRARequest("sql-lora", 1, "/adapters/sql")}
    assert per_request(frames, a)[0] == "echo0: h" and per_request(frames, b)[0] == "sql-lora"


values = st.recursive(st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=5)
sides = st.fixed_dictionaries({}, optional={
    "params": st.one_of(values, st.fixed_dictionaries({}, optional={name: values for name in sampling.NAMES})),
    "model": values, "response_format": values, "colour": values})


@hypothesis_settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                     database=None)
@given(frame=st.fixed_dictionaries({"type": st.just("compare"), "messages": st.just(ASK)},
                                   optional={"sides": st.one_of(values, st.lists(st.one_of(sides, values), max_size=3))}))
def test_any_compare_frame_is_parsed_into_two_sides_or_refused_with_the_clients_error(frame):
    """No frame makes the parser raise anything but InvalidInput (an error frame, never a 500)."""
    limits_ = django_settings.PLAYGROUND_LIMITS
    try:
        parsed = parse_frame(json.dumps(frame), sampling.defaults(limits_), limits_)
    except InvalidInput as exc:
        assert str(exc)
        return
    assert isinstance(parsed, Compare) and len(parsed.sides) == 2
    assert all(side.messages == ASK and isinstance(side.params, dict) for side in parsed.sides)
