"""A worker's drain on SIGTERM (playground/serving/worker/drain.py).

The first two tests run the real runtime around the scripted engine (fake_worker.py): a request still running
when the drain time ends is cut with an error frame, one that ends in time is answered normally. The slow one
runs the distributed stack: daphne and two real Celery workers over the real Redis with the real model, whose
engine steps are paced (paced_worker.py) so a stream lasts longer than Docker's 10 s default stop timeout.
"""
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import pytest
from fake_worker import connect, generate, until_end, worker
from live_stack import REPO, LiveStack
from websockets.asyncio.client import connect as ws_connect

from playground.serving.shared import registry
from playground.serving.worker.runtime import WorkerRuntime

LONG_ASK = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]
LONG_FAKE = [{"role": "user", "content": "z" * 400}]  # the scripted engine echoes it, a character a token


def capture_runtimes(monkeypatch) -> list[WorkerRuntime]:
    started: list[WorkerRuntime] = []
    original = WorkerRuntime.start

    def start(self: WorkerRuntime) -> None:
        started.append(self)
        original(self)

    monkeypatch.setattr(WorkerRuntime, "start", start)
    return started


async def until_state(name: str, state: str, timeout: float) -> float:
    """Seconds until the worker's registry entry shows `state`."""
    began = time.monotonic()
    while (registry.get(name) or {}).get("state") != state:
        assert time.monotonic() - began < timeout, f"{name} never said {state!r}: {registry.get(name)}"
        await asyncio.sleep(0.02)
    return time.monotonic() - began


def drain_mid_stream(monkeypatch, settings, drain_s: float, max_tokens: int):
    """Start a stream of `max_tokens` (10 ms each), drain the worker after its first token: (the started
    frame, every later frame, seconds until the registry said draining, seconds until the last frame, engine)."""
    settings.PLAYGROUND_DRAIN_S = drain_s
    runtimes = capture_runtimes(monkeypatch)

    async def scenario():
        async with worker(monkeypatch, delay=0.01) as (engine, _):
            ws = await connect()
            await ws.send_json_to(generate(LONG_FAKE, max_tokens=max_tokens))
            started = await ws.receive_json_from(timeout=5)
            assert (await ws.receive_json_from(timeout=5))["type"] == "token"
            runtime = runtimes[0]
            began = time.monotonic()
            runtime.drain.begin()
            said_draining_after = await until_state(runtime.name, "draining", 1)
            frames = await until_end(ws)
            ended_after = time.monotonic() - began
            await ws.disconnect()
            return started, frames, said_draining_after, ended_after, engine

    return asyncio.run(scenario())


@pytest.mark.django_db(transaction=True)
def test_a_request_still_running_when_the_drain_time_ends_gets_an_error_frame(monkeypatch, settings):
    started, frames, said_draining_after, ended_after, engine = drain_mid_stream(monkeypatch, settings, 0.5, 400)
    assert said_draining_after < 0.3  # at once, not at the next heartbeat
    end = frames[-1]
    assert end["type"] == "error" and "shut down before this request finished" in end["message"], end
    assert 0.5 <= ended_after < 2.0  # it had its drain time (of a 4 s stream), then no more
    assert started["request_id"] in engine.aborted  # its blocks were freed by the engine


@pytest.mark.django_db(transaction=True)
def test_a_request_that_ends_within_the_drain_time_is_answered(monkeypatch, settings):
    _, frames, said_draining_after, _, engine = drain_mid_stream(monkeypatch, settings, 5, 40)
    assert said_draining_after < 0.3
    done = frames[-1]
    assert done["type"] == "done" and done["outputs"][0]["finish_reason"] == "length", done
    assert done["usage"]["completion_tokens"] == 40 and not engine.aborted


async def turn(ws, conversation_id: str | None, content: str, max_tokens: int) -> None:
    """Send one chat turn on `ws` (its frames are read by the scenario, keyed by request id)."""
    await ws.send(json.dumps({"type": "generate", "conversation_id": conversation_id,
                              "messages": [{"role": "user", "content": content}],
                              "params": {"temperature": 0, "max_tokens": max_tokens}}))


@pytest.mark.slow
def test_a_sigtermed_worker_finishes_its_stream_while_follow_ups_go_to_the_other(tmp_path):
    """Worker X served a conversation's first turn; its second turn, a long stream, is on X (sticky) when X
    gets SIGTERM. X's registry entry says draining at once, a third turn sent then is served by Y, X's stream
    completes (longer than 10 s) and X exits cleanly: nothing is lost."""
    live = LiveStack(tmp_path, extra_env={"PLAYGROUND_TEST_STEP_S": "0.08", "PLAYGROUND_DRAIN_S": "60",
                                          "PYTHONPATH": str(REPO)})
    paced = [sys.executable, str(Path(__file__).with_name("paced_worker.py"))]
    try:
        live.start_web()
        for name in ("x@drain", "y@drain"):
            live.start_worker(name, program=paced)
        live.wait_workers_ready()

        async def scenario():
            async with ws_connect(live.ws_url, origin=live.base_url, proxy=None, open_timeout=30) as ws:
                frames: dict[str, list[dict]] = {}

                async def read_until(done_count: int) -> None:
                    while sum(f[-1]["type"] in ("done", "error") for f in frames.values() if f) < done_count:
                        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                        assert "request_id" in frame, frame
                        frames.setdefault(frame["request_id"], []).append({**frame, "at": time.monotonic()})

                await turn(ws, None, "Say hello.", 8)
                await read_until(1)
                first = next(iter(frames.values()))[-1]
                assert first["type"] == "done", first
                conversation, x = first["conversation_id"], first["worker"]
                y = ({"x@drain", "y@drain"} - {x}).pop()

                await turn(ws, conversation, LONG_ASK[0]["content"], 200)
                while not any(f[-1]["type"] == "token" for f in list(frames.values())[1:] if f):
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    frames.setdefault(frame["request_id"], []).append({**frame, "at": time.monotonic()})
                long_id = list(frames)[1]
                sigterm_at = time.monotonic()
                live.workers[x].send_signal(signal.SIGTERM)
                draining_after = await asyncio.to_thread(wait_draining, live, x, sigterm_at)

                await turn(ws, conversation, "And now say goodbye.", 8)
                await read_until(3)
                return frames, long_id, x, y, sigterm_at, draining_after

        frames, long_id, x, y, sigterm_at, draining_after = asyncio.run(scenario())
        assert draining_after < 1.5, draining_after
        ends = {rid: f[-1] for rid, f in frames.items()}
        assert all(end["type"] == "done" for end in ends.values()), ends  # nothing lost
        long_frames = frames[long_id]
        long_done = ends[long_id]
        assert long_done["worker"] == x  # sticky: the second turn went to X's own queue
        # Its own end (the length limit, or the model's end of turn), not the shutdown's abort.
        assert long_done["outputs"][0]["finish_reason"] in ("length", "stop")
        assert long_frames[-1]["at"] - long_frames[0]["at"] > 10  # longer than Docker's default stop timeout
        assert long_done["at"] - sigterm_at > 5  # it was mid-stream when X was told to stop
        follow_up = next(end for rid, end in ends.items() if rid not in (long_id, list(frames)[0]))
        assert follow_up["worker"] == y  # the draining X was not chosen, though the conversation prefers it
        assert live.workers[x].wait(30) == 0  # X exits once its stream is done
        assert registry_states(live).get(y) == "ready" and x not in registry_states(live)
    finally:
        live.stop()


def wait_draining(live: LiveStack, name: str, since: float) -> float:
    """Seconds after `since` until /healthz shows `name` draining."""
    live.wait(lambda: registry_states(live).get(name) == "draining", 10, f"{name} to say draining")
    return time.monotonic() - since


def registry_states(live: LiveStack) -> dict[str, str]:
    return {w["name"]: w["state"] for w in (live.health() or {}).get("workers", [])}
