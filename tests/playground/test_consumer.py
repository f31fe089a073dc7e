"""ChatConsumer over `channels.testing.WebsocketCommunicator`, with the real worker runtime, engine service
and in-memory channel layer, and a scripted engine in place of the model (tests/playground/fake_worker.py).
"""
import asyncio
import json
import time

import pytest
from channels.testing import WebsocketCommunicator
from fake_engine import MESSAGE_OVERHEAD
from fake_worker import ASK, ORIGIN, connect, generate, until_end, worker

from playground.asgi import application
from playground.chat.models import Conversation, Message
from playground.serving.shared.naming import GPU_QUEUE
from playground.serving.web import dispatch

pytestmark = pytest.mark.django_db(transaction=True)


def run(coro):
    return asyncio.run(coro)


def test_stream_concatenates_to_the_saved_final_text(monkeypatch):
    async def scenario():
        async with worker(monkeypatch):
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=64))
            started = await ws.receive_json_from(timeout=5)
            frames = await until_end(ws)
            await ws.disconnect()
            return started, frames

    started, frames = run(scenario())
    assert started["type"] == "started"
    tokens, done = frames[:-1], frames[-1]
    assert done["type"] == "done" and done["request_id"] == started["request_id"]
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    assert all(t["type"] == "token" and t["index"] == 0 for t in tokens)
    text = "".join(t["text"] for t in tokens)
    assert text == done["outputs"][0]["text"] == "echo0: hi there"
    assert done["outputs"][0]["finish_reason"] == "stop"
    assert done["worker"] == "fake@test"
    assert done["usage"] == {"prompt_tokens": MESSAGE_OVERHEAD + len("hi there"), "completion_tokens": len(text),
                             "cached_tokens": 0}
    assert done["timing"]["ttft_ms"] >= 0 and done["timing"]["tokens_per_s"] > 0

    conversation = Conversation.objects.get(id=done["conversation_id"])
    saved = list(conversation.messages.order_by("position").values_list("role", "content", "finish_reason"))
    assert saved == [("user", "hi there", ""), ("assistant", text, "stop")]
    assert conversation.last_worker == "fake@test"
    assert conversation.session_key and conversation.user is None


def test_a_burst_of_new_chats_each_stores_its_own_conversation(monkeypatch):
    """Sent at once, their conversations are created together (chat/transcripts.py): none is lost or mixed up."""

    async def scenario():
        async with worker(monkeypatch):
            sockets = [await connect() for _ in range(6)]
            for i, ws in enumerate(sockets):
                await ws.send_json_to(generate([{"role": "user", "content": f"question {i}"}]))
            frames = [[await ws.receive_json_from(timeout=5), *await until_end(ws)] for ws in sockets]
            for ws in sockets:
                await ws.disconnect()
            return frames

    for i, (started, *_, done) in enumerate(run(scenario())):
        assert started["type"] == "started" and done["conversation_id"] == started["conversation_id"]
        conversation = Conversation.objects.get(id=started["conversation_id"])
        saved = list(conversation.messages.order_by("position").values_list("role", "content"))
        assert saved == [("user", f"question {i}"), ("assistant", f"echo0: question {i}")]
        assert conversation.leaf_id == done["message_id"] and conversation.title == f"question {i}"


def test_while_chats_stream_together_their_frames_share_the_worker_s_frame_budget(monkeypatch, settings):
    """Two chats at once and 10 chat frames a second for the worker: each chat's token frames come ~0.2 s apart
    (its text merged meanwhile) after its first token at once, instead of one per 30 ms coalescing window; the
    text is whole and the `done` not held."""
    settings.PLAYGROUND_WS_FRAMES_PER_S = 10

    async def chat(ws):
        await ws.send_json_to(generate([{"role": "user", "content": "x" * 60}], max_tokens=100))
        assert (await ws.receive_json_from(timeout=5))["type"] == "started"
        frames = []
        while not frames or frames[-1][1]["type"] != "done":
            frames.append((time.monotonic(), await ws.receive_json_from(timeout=5)))
        await ws.disconnect()
        return frames

    async def scenario():
        async with worker(monkeypatch, delay=0.01) as (_, submitted):
            sockets = [await connect(), await connect()]
            return await asyncio.gather(*(chat(ws) for ws in sockets)), submitted

    chats, submitted = run(scenario())
    assert [s["job"].paced for s in submitted] == [True, True]
    for frames in chats:
        tokens, (done_at, done) = [(at, f) for at, f in frames if f["type"] == "token"], frames[-1]
        assert "".join(f["text"] for _, f in tokens) == done["outputs"][0]["text"] == "echo0: " + "x" * 60
        gaps = [b - a for (a, _), (b, _) in zip(tokens, tokens[1:])]
        assert 2 <= len(tokens) <= 6 and min(gaps[1:]) > 0.15, gaps  # ~0.7 s of tokens: unpaced, ~20 frames
        assert done_at - tokens[-1][0] < 0.25


def test_follow_up_turn_is_routed_to_the_last_worker_and_keeps_the_transcript(monkeypatch):
    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=8))
            first = (await until_end(ws))[-1]
            history = ASK + [{"role": "assistant", "content": first["outputs"][0]["text"]}]
            follow_up = generate(history + [{"role": "user", "content": "again"}], max_tokens=8)
            await ws.send_json_to({**follow_up, "conversation_id": first["conversation_id"]})
            second = (await until_end(ws))[-1]
            await ws.disconnect()
            return first, second, submitted

    first, second, submitted = run(scenario())
    assert second["conversation_id"] == first["conversation_id"]
    assert [s["preferred_worker"] for s in submitted] == ["", "fake@test"]
    roles = Conversation.objects.get(id=first["conversation_id"]).messages.values_list("role", flat=True)
    assert list(roles) == ["user", "assistant", "user", "assistant"]


def test_a_conversation_longer_than_the_window_drops_its_oldest_turns_and_says_so(monkeypatch):
    """The chat socket asks the worker to fit the window: the engine gets the system prompt and the latest
    turns, the `done` frame's `context` says what was left out, and the stored conversation keeps it all."""
    system = {"role": "system", "content": "be brief"}
    turns = [{"role": role, "content": f"{role} {i} " + "x" * 30} for i in range(4) for role in ("user", "assistant")]
    messages = [system, *turns, {"role": "user", "content": "and now?"}]

    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            engine.engine.max_model_len = 230  # the fake template: 4 tokens a message, 1 a character
            ws = await connect()
            await ws.send_json_to(generate(messages, max_tokens=20))
            done = (await until_end(ws))[-1]
            await ws.disconnect()
            return done, engine.requests[-1], engine.encode_chat, submitted

    done, request, encode_chat, submitted = run(scenario())
    assert submitted[0]["fit_window"] is True
    seen = [system, *turns[4:], messages[-1]]  # the two oldest turns went, whole
    assert request["messages"] is None and request["prompt"] == encode_chat(seen)  # rendered once, while fitting
    context = done["context"]
    assert context["dropped_messages"] == 4 and context["dropped_turns"] == 2
    assert context["window"] == 230 and context["max_tokens"] == 20
    assert context["prompt_tokens"] == sum(4 + len(m["content"]) for m in seen)
    assert context["prompt_tokens"] + 20 <= 230 < context["prompt_tokens"] + 20 + sum(4 + len(m["content"]) for m in turns[2:4])
    assert context["conversation_tokens"] - context["prompt_tokens"] == context["dropped_tokens"]
    stored = Conversation.objects.get(id=done["conversation_id"]).messages.count()
    assert stored == len(messages) + 1  # every message and the reply: fitting changes what the engine sees only


def test_n_samples_stream_side_by_side(monkeypatch):
    async def scenario():
        async with worker(monkeypatch):
            ws = await connect()
            await ws.send_json_to(generate(n=2, max_tokens=6))
            frames = await until_end(ws)
            await ws.disconnect()
            return frames

    frames = run(scenario())
    done = frames[-1]
    streamed = {0: "", 1: ""}
    for frame in frames:
        if frame["type"] == "token":
            streamed[frame["index"]] += frame["text"]
    assert streamed == {0: "echo0:", 1: "echo1:"}
    assert [(o["index"], o["text"], o["finish_reason"]) for o in done["outputs"]] == [
        (0, "echo0:", "length"), (1, "echo1:", "length"),
    ]
    reply = Conversation.objects.get(id=done["conversation_id"]).messages.get(role="assistant")
    assert reply.samples == ["echo0:", "echo1:"] and reply.content == "echo0:"


def test_logprobs_in_range_reach_the_engine_and_out_of_range_is_refused_naming_the_field(monkeypatch):
    """The chat page's "Token probabilities" toggle sends params.logprobs, checked by the sampling table
    (0..20, the engine's most): the engine is asked for that many alternatives per token; a value outside the
    range or not an integer is an error frame naming the field, and nothing is queued for it."""
    bad = [21, -1, 2.5, True, "5"]

    async def scenario():
        async with worker(monkeypatch) as (engine, submitted):
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=4, logprobs=5))
            done = (await until_end(ws))[-1]
            errors = []
            for value in bad:
                await ws.send_json_to(generate(max_tokens=4, logprobs=value))
                errors.append(await ws.receive_json_from(timeout=5))
            await ws.disconnect()
            return done, errors, engine, submitted

    done, errors, engine, submitted = run(scenario())
    assert done["type"] == "done" and len(submitted) == 1
    assert [request["params"].logprobs for request in engine.requests] == [5]
    assert [e["type"] for e in errors] == ["error"] * len(bad) and all("request_id" not in e for e in errors)
    assert [e["message"] for e in errors] == [
        "params.logprobs must be in [0, 20], got 21",
        "params.logprobs must be in [0, 20], got -1",
        "params.logprobs must be an integer or null",
        "params.logprobs must be an integer or null",
        "params.logprobs must be an integer or null",
    ]


@pytest.mark.parametrize(
    "frame, needle",
    [
        ("not json", "not valid JSON"),
        ('{"type": "dance"}', "type must be"),
        ('{"type": "generate", "messages": []}', "non-empty"),
        ('{"type": "generate", "messages": [{"role": "user", "content": "x"}], "params": {"top_p": 7}}', "top_p"),
        ('{"type": "cancel", "request_id": "nope"}', "no running request"),
        ('{"type": "generate", "conversation_id": "7f1c1a8e-0000-4000-8000-000000000000", '
         '"messages": [{"role": "user", "content": "x"}]}', "not found"),
        ('{"type": "generate", "pad": "' + "x" * 70_000 + '"}', "larger than"),
        # Invalid Unicode (SQLite refused it: "internal server error") and deep nesting (a RecursionError).
        (json.dumps({"type": "generate", "messages": [{"role": "user", "content": "hi \ud800"}]}),
         "messages[0].content contains an unpaired surrogate"),
        (json.dumps({"type": "generate", "messages": [{"role": "user", "content": "a\x00b"}]}),
         "messages[0].content contains a NUL character"),
        (json.dumps({"type": "generate", "messages": ASK, "params": {"stop": ["\udc00"]}}), "params.stop[0] contains"),
        ('{"type": "generate", "pad": ' + "[" * 30_000 + "]" * 30_000 + "}", "deeper than 32 levels"),
    ],
)
def test_bad_frames_get_an_error_and_the_socket_survives(monkeypatch, frame, needle):
    async def scenario():
        async with worker(monkeypatch) as (_, submitted):
            ws = await connect()
            await ws.send_to(text_data=frame)
            error = await ws.receive_json_from(timeout=5)
            await ws.send_json_to(generate(max_tokens=4))
            after = await until_end(ws)
            await ws.disconnect()
            return error, after, submitted

    error, after, submitted = run(scenario())
    assert error["type"] == "error" and needle in error["message"] and "request_id" not in error
    assert after[-1]["type"] == "done" and len(submitted) == 1  # only the good frame reached a worker
    assert Message.objects.filter(role="user").count() == 1 and Conversation.objects.count() == 1


def test_binary_frame_is_refused():
    async def scenario():
        ws = await connect()
        await ws.send_to(bytes_data=b"\x00\x01")
        error = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return error

    assert "text frames" in run(scenario())["message"]


def test_engine_rejection_is_an_error_for_that_request(monkeypatch):
    async def scenario():
        async with worker(monkeypatch):
            ws = await connect()
            await ws.send_json_to(generate([{"role": "user", "content": "REJECT me"}]))
            started = await ws.receive_json_from(timeout=5)
            error = await ws.receive_json_from(timeout=5)
            await ws.disconnect()
            return started, error

    started, error = run(scenario())
    assert error == {"type": "error", "request_id": started["request_id"],
                     "message": "prompt is longer than max_model_len (fake engine)"}


def test_cancel_aborts_in_the_engine_and_ends_with_done(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.05) as (engine, _):
            ws = await connect()
            await ws.send_json_to(generate([{"role": "user", "content": "x" * 500}], max_tokens=500))
            started = await ws.receive_json_from(timeout=5)
            first = await ws.receive_json_from(timeout=5)
            cancelled_at = time.monotonic()
            await ws.send_json_to({"type": "cancel", "request_id": started["request_id"]})
            frames = await until_end(ws)
            elapsed = time.monotonic() - cancelled_at
            await ws.disconnect()
            return started, first, frames, elapsed, engine

    started, first, frames, elapsed, engine = run(scenario())
    assert first["type"] == "token"
    done = frames[-1]
    assert done["type"] == "done" and done["outputs"][0]["finish_reason"] == "abort"
    assert elapsed < 1.0
    assert engine.aborted == [started["request_id"]] and not engine.live
    streamed = first["text"] + "".join(f["text"] for f in frames if f["type"] == "token")
    assert streamed == done["outputs"][0]["text"] and len(streamed) < 50


def test_disconnect_aborts_running_requests(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.05) as (engine, _):
            ws = await connect()
            await ws.send_json_to(generate([{"role": "user", "content": "y" * 500}], max_tokens=500))
            started = await ws.receive_json_from(timeout=5)
            await ws.receive_json_from(timeout=5)  # a first token: the engine is running it
            await ws.disconnect()
            deadline = time.monotonic() + 2
            while engine.live and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return started, engine

    started, engine = run(scenario())
    assert engine.aborted == [started["request_id"]] and not engine.live


def test_a_worker_that_stops_heartbeating_fails_its_request(monkeypatch):
    """The task was accepted by a worker that then vanished: the watchdog reports it within seconds."""

    async def scenario():
        async def accept_and_die(request_id, reply_to):
            from channels.layers import get_channel_layer

            await get_channel_layer().send(
                reply_to, {"type": "gen.accepted", "request_id": request_id, "worker": "ghost@nowhere"}
            )

        def submit_many(jobs):
            for request_id, job in jobs:
                asyncio.run_coroutine_threadsafe(accept_and_die(request_id, job.reply_to), loop)
            return [GPU_QUEUE] * len(jobs)

        loop = asyncio.get_running_loop()
        monkeypatch.setattr(dispatch, "submit_many", submit_many)
        ws = await connect()
        await ws.send_json_to(generate())
        started = await ws.receive_json_from(timeout=5)
        t0 = time.monotonic()
        error = await ws.receive_json_from(timeout=10)
        waited = time.monotonic() - t0
        await ws.disconnect()
        return started, error, waited

    started, error, waited = run(scenario())
    assert error["type"] == "error" and error["request_id"] == started["request_id"]
    assert "ghost@nowhere stopped responding" in error["message"]
    assert waited < 3


def test_no_worker_at_all_is_an_error_not_a_hang(monkeypatch, settings):
    settings.PLAYGROUND_NO_WORKER_GRACE = 0.5
    monkeypatch.setattr(dispatch, "submit_many", lambda jobs: [GPU_QUEUE] * len(jobs))

    async def scenario():
        ws = await connect()
        await ws.send_json_to(generate())
        await ws.receive_json_from(timeout=5)
        error = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return error

    assert run(scenario())["message"] == "no GPU worker is running"


def test_broker_failure_is_reported(monkeypatch):
    def broken_submit(jobs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(dispatch, "submit_many", broken_submit)

    async def scenario():
        ws = await connect()
        await ws.send_json_to(generate())
        started = await ws.receive_json_from(timeout=5)
        error = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return started, error

    started, error = run(scenario())
    assert error["request_id"] == started["request_id"] and "broker is unavailable" in error["message"]


def test_foreign_origin_is_refused():
    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/chat/", headers=[(b"origin", b"http://evil.example")])
        connected, _ = await communicator.connect(timeout=5)
        return connected

    assert run(scenario()) is False


def test_anonymous_socket_refused_when_anonymous_use_is_off(settings):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = False

    async def scenario():
        communicator = WebsocketCommunicator(application, "/ws/chat/", headers=[ORIGIN])
        return await communicator.connect(timeout=5)

    connected, code = run(scenario())
    assert connected is False and code == 4401


def test_a_server_fault_is_reported_and_the_socket_stays_usable(monkeypatch):
    from playground.chat import store

    real_create = store.create_conversations  # a new chat's transcript write (chat/transcripts.py)
    calls = []

    def flaky_create(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("database is down")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(store, "create_conversations", flaky_create)

    async def scenario():
        async with worker(monkeypatch, delay=0.05) as (engine, submitted):  # slow enough to be aborted mid-reply
            ws = await connect()
            await ws.send_json_to(generate())
            error = await ws.receive_json_from(timeout=5)
            await ws.send_json_to(generate(max_tokens=3))
            after = await until_end(ws)
            await ws.disconnect()
            return error, after, engine, submitted

    error, after, engine, submitted = run(scenario())
    assert error == {"type": "error", "message": "internal server error"}
    assert after[-1]["type"] == "done"
    # The turn whose transcript failed had been queued for a worker: it was aborted, in the engine or before
    # reaching it (a worker drops a request it hears the abort of first), and no frame named it.
    failed = submitted[0]["request_id"]
    reached_the_engine = failed in [r["request_id"] for r in engine.requests]
    assert failed in engine.aborted if reached_the_engine else failed not in engine.live
    assert after[0]["type"] == "started" and after[0]["request_id"] == submitted[1]["request_id"]


def test_a_turn_reaches_the_engine_while_its_transcript_is_still_being_written(monkeypatch):
    """A burst of turns queues its database writes on one thread; the engine must not wait for them. Here the
    transcript's write finishes only once the turn has been queued for a worker (on the old order it never
    would), and the frames still come in order: `started` first, then the tokens."""
    from playground.chat import store

    real_create = store.create_conversations  # a new chat's transcript write (chat/transcripts.py)
    submitted: list[dict] = []  # the worker's list of queued turns, once it runs

    def create_after_the_turn_is_queued(*args, **kwargs):
        deadline = time.monotonic() + 5
        while not submitted and time.monotonic() < deadline:
            time.sleep(0.01)
        if not submitted:
            raise AssertionError("the turn was not queued while its transcript was being written")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(store, "create_conversations", create_after_the_turn_is_queued)

    async def scenario():
        nonlocal submitted
        async with worker(monkeypatch) as (_, queued):
            submitted = queued
            ws = await connect()
            await ws.send_json_to(generate(max_tokens=8))
            frames = await until_end(ws, timeout=10)
            await ws.disconnect()
            return frames

    frames = run(scenario())
    assert frames[0]["type"] == "started" and frames[-1]["type"] == "done"
    assert [f["type"] for f in frames[1:-1]] == ["token"] * (len(frames) - 2) and len(frames) > 2
    assert "".join(f["text"] for f in frames[1:-1]) == frames[-1]["outputs"][0]["text"]


def test_a_prefork_worker_refuses_to_start():
    from types import SimpleNamespace

    from playground.serving.worker import runtime as worker_module

    with pytest.raises(SystemExit, match="leave out --pool"):
        worker_module._start_runtime(SimpleNamespace(pool_cls="prefork", hostname="w@h"))
