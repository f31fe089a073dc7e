"""The demo: start-frame validation, and DemoConsumer over WebsocketCommunicator with the real worker
runtime and a scripted engine (tests/playground/fake_engine.py): a run's users stream to every watcher,
stop aborts them in the engine, and only presenters may start a run."""
import asyncio
import contextlib

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from fake_worker import ORIGIN, worker

from playground.asgi import application
from playground.serving.shared import kv_feed
from playground.accounts.access import may_present, may_use_playground
from playground.demo.consumers import parse_start
from playground.demo.presets import PRESETS, SHARED_SYSTEM, preset
from playground.demo.runner import runner
from playground.serving.web import dispatch
from playground.serving.web.edge import InvalidInput

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.asynccontextmanager
async def demo_worker(monkeypatch, delay: float = 0.002):
    """fake_worker's worker; the demo never sends plain prompts, so its submit needs no `prompt`."""
    async with worker(monkeypatch, delay) as (engine, submitted):
        send = dispatch.submit_many
        engine.salts = []  # the cache salt of every request, in order

        def submit_many(jobs):
            engine.salts.extend(job.cache_salt for _, job in jobs)
            return send(jobs)

        monkeypatch.setattr(dispatch, "submit_many", submit_many)
        try:
            yield engine
        finally:
            await runner.stop()
            runner.run = None


async def watch(headers=(ORIGIN,)) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, "/ws/demo/", headers=list(headers))
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


async def events_until(ws: WebsocketCommunicator, run_state: str, timeout: float = 10) -> list[dict]:
    """Event frames (snapshots skipped) up to the run reaching `run_state`."""
    events = []
    while True:
        frame = await ws.receive_json_from(timeout=timeout)
        if frame["type"] == "snapshot":
            continue
        events.append(frame)
        if frame.get("kind") == "run" and frame["run"]["state"] == run_state:
            return events


def test_start_frames_are_validated():
    run = parse_start({"type": "start", "users": 8, "rate": 2, "max_tokens": 16, "cache_salt": True})
    assert (run.users, run.rate, run.max_tokens, run.cache_salt) == (8, 2.0, 16, True)
    for bad, needle in [({"users": 0}, "users"), ({"users": 10**6}, "users"), ({"users": 2, "rate": 0}, "rate"),
                        ({"users": 2, "rate": float("nan")}, "rate"), ({"users": 2, "max_tokens": 10**6}, "max_tokens"),
                        ({"users": 2, "cache_salt": "yes"}, "cache_salt"), ({"users": 2, "x": 1}, "unknown"),
                        ({"users": True}, "users")]:
        with pytest.raises(InvalidInput, match=needle):
            parse_start({"type": "start", **bad})


def test_presets_share_a_system_prompt_and_repeat_with_numbered_names():
    shared = [p for p in PRESETS if p["messages"][0]["content"] == SHARED_SYSTEM]
    assert len(shared) >= 4 and len(shared) < len(PRESETS)
    assert preset(len(PRESETS))["name"] == PRESETS[0]["name"] + " 2"


def test_a_run_streams_every_user_to_every_watcher(monkeypatch):
    async def scenario():
        async with demo_worker(monkeypatch):
            presenter, viewer = await watch(), await watch()
            assert (await presenter.receive_json_from())["type"] == "state"
            assert (await viewer.receive_json_from())["type"] == "state"
            await presenter.send_json_to({"type": "start", "users": 3, "rate": 50, "max_tokens": 8})
            seen = [await events_until(ws, "finished") for ws in (presenter, viewer)]
            late = await watch()
            state = await late.receive_json_from()
            for ws in (presenter, viewer, late):
                await ws.disconnect()
            return seen, state

    (presenter_events, viewer_events), state = asyncio.run(scenario())
    assert [e["kind"] for e in presenter_events] == [e["kind"] for e in viewer_events]
    finished = {u["user"]: u for u in state["users"]}
    assert sorted(finished) == [0, 1, 2] and state["run"]["state"] == "finished"
    for number, user in finished.items():
        messages = preset(number)["messages"]
        assert user["state"] == "done" and user["text"] == f"echo0: {messages[-1]['content']}"[:8]
        streamed = "".join(e["text"] for e in presenter_events if e["kind"] == "tokens" and e["user"] == number)
        assert streamed == user["text"]
        assert user["usage"]["completion_tokens"] == len(user["text"])


def test_stop_aborts_the_users_in_the_engine(monkeypatch):
    async def scenario():
        async with demo_worker(monkeypatch, delay=0.05) as engine:
            ws = await watch()
            await ws.receive_json_from()
            await ws.send_json_to({"type": "start", "users": 2, "rate": 50, "max_tokens": 200})
            while True:  # until someone streams
                frame = await ws.receive_json_from(timeout=5)
                if frame.get("kind") == "tokens":
                    break
            await ws.send_json_to({"type": "stop"})
            events = await events_until(ws, "stopped")
            await asyncio.sleep(0.3)
            await ws.disconnect()
            return events, engine

    events, engine = asyncio.run(scenario())
    assert events[-1]["run"]["state"] == "stopped"
    assert {u["state"] for u in events[-1]["users"]} == {"stopped"}
    assert engine.aborted
    assert all(stop.is_set() for stop in engine.live.values())  # nothing keeps generating


def test_only_presenters_start_runs_when_anonymous_use_is_off(settings):
    settings.PLAYGROUND_ALLOW_ANONYMOUS = False

    async def scenario():
        anonymous = WebsocketCommunicator(application, "/ws/demo/", headers=[ORIGIN])
        connected, code = await anonymous.connect(timeout=5)
        return connected, code

    connected, code = asyncio.run(scenario())
    assert not connected and code == 4401
    bob = User.objects.create_user("bob")
    assert may_use_playground(bob) and not may_present(bob)
    bob.is_staff = True
    assert may_present(bob)


def test_bad_frames_get_an_error_and_the_socket_stays(monkeypatch):
    async def scenario():
        async with demo_worker(monkeypatch):
            ws = await watch()
            await ws.receive_json_from()
            answers = []
            for frame in ('{"type": "start", "users": -1}', "not json", '{"type": "dance"}'):
                await ws.send_to(text_data=frame)
                answers.append(await ws.receive_json_from(timeout=5))
                while answers[-1]["type"] == "snapshot":
                    answers[-1] = await ws.receive_json_from(timeout=5)
            await ws.disconnect()
            return answers

    answers = asyncio.run(scenario())
    assert [a["type"] for a in answers] == ["error"] * 3
    assert "users" in answers[0]["message"] and "JSON" in answers[1]["message"]


def test_watchers_get_the_workers_summary_snapshots():
    async def scenario():
        ws = await watch()
        await ws.receive_json_from()  # state
        snapshot = {"type": "snapshot", "worker": "w", "time": 1.0, "metrics": {"num_blocks_used": 3}}
        await get_channel_layer().group_send(kv_feed.SUMMARY_GROUP, {"type": kv_feed.SNAPSHOT, "snapshot": snapshot})
        relayed = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return snapshot, relayed

    snapshot, relayed = asyncio.run(scenario())
    assert relayed == snapshot


@pytest.mark.parametrize("salted", [False, True])
def test_the_cache_salt_switch_gives_each_simulated_user_their_own_salt(monkeypatch, salted):
    async def scenario():
        async with demo_worker(monkeypatch) as engine:
            ws = await watch()
            await ws.receive_json_from()
            await ws.send_json_to({"type": "start", "users": 3, "rate": 50, "max_tokens": 2, "cache_salt": salted})
            await events_until(ws, "finished")
            await ws.disconnect()
            return engine.salts

    salts = asyncio.run(scenario())
    assert len(salts) == 3
    if salted:
        assert None not in salts and len(set(salts)) == 3
    else:
        assert salts == [None] * 3
