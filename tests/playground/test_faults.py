"""The fault suite: the distributed stack (manage.py web, two real Celery GPU workers with the real model)
over a PRIVATE redis-server on its own port, with chat clients streaming when something breaks:
- a worker is SIGKILLed mid-stream;
- Redis is SIGKILLed mid-stream, then restarted;
- one worker's engine loop raises (outside `step()`, injected by faulty_worker.py).
Each time every client hears its reply or an error within 10 s, no concurrency slot stays taken and no KV
block stays used (asserted), and new requests are served afterwards."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from live_stack import REPO, LiveStack, PrivateRedis
from websockets.asyncio.client import connect

pytestmark = pytest.mark.slow
FAULT_WINDOW_S = 10.0
LONG = 160  # max_tokens of the streams a fault interrupts


async def chat(stack: LiveStack, content: str, max_tokens: int, first_token: asyncio.Event | None = None) -> dict:
    """One chat client: its last frame (done or error) with `at` (monotonic time it arrived) added."""
    async with connect(stack.ws_url, origin=stack.base_url, proxy=None, open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "generate", "messages": [{"role": "user", "content": content}],
                                  "params": {"temperature": 0, "max_tokens": max_tokens}}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if frame["type"] == "token" and first_token is not None:
                first_token.set()
            if frame["type"] in ("done", "error"):
                return {**frame, "at": time.monotonic()}


async def streaming_clients(stack: LiveStack, count: int) -> tuple[list[asyncio.Task], float]:
    """`count` clients with long replies, each past its first token."""
    started = [asyncio.Event() for _ in range(count)]
    tasks = [asyncio.create_task(chat(stack, f"Tell a long story about the number {i}.", LONG, started[i]))
             for i in range(count)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
    return tasks, time.monotonic()


def assert_ended_in_time(ends: list[dict], fault_at: float) -> None:
    late = [e for e in ends if e["at"] - fault_at > FAULT_WINDOW_S and e["type"] == "error"]
    assert not late, f"errors later than {FAULT_WINDOW_S} s after the fault: {late}"
    assert all(e["type"] in ("done", "error") for e in ends)


def assert_no_slot_held(redis: PrivateRedis, timeout: float = 3) -> None:
    """Every concurrency counter back at 0 (a slot is released just after the client's last frame)."""
    client = redis.client()
    deadline = time.monotonic() + timeout
    while True:
        taken = {key.decode(): int(client.get(key) or 0) for key in client.keys("*limits:conc:*")}
        if all(value == 0 for value in taken.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"slots still taken: {taken}")
        time.sleep(0.1)


def assert_idle_without_blocks(stack: LiveStack, worker: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        metrics = stack.worker_metrics(worker)
        if metrics["num_requests_running"] == metrics["num_requests_waiting"] == metrics["num_blocks_used"] == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{worker} still holds work or blocks: {metrics}")
        time.sleep(0.3)


def new_requests_work(stack: LiveStack, count: int = 3) -> None:
    async def clients():
        return await asyncio.gather(*(chat(stack, f"Say hello number {i}.", 8) for i in range(count)))

    ends = asyncio.run(clients())
    assert [e["type"] for e in ends] == ["done"] * count, ends


@pytest.fixture
def stack(tmp_path):
    """The web process and two workers, a (faulty-capable) `w1` and a plain `w2`, over a private Redis."""
    redis = PrivateRedis(tmp_path)
    redis.start()
    fault_flag = tmp_path / "fault"
    live = LiveStack(tmp_path, {"PLAYGROUND_TEST_FAULT_FILE": str(fault_flag), "PYTHONPATH": str(REPO)}, redis)
    live.fault_flag, live.redis = fault_flag, redis
    try:
        live.start_web()
        live.start_worker("w1@faults", [sys.executable, str(Path(__file__).with_name("faulty_worker.py"))])
        live.start_worker("w2@faults")
        live.wait_workers_ready()
        yield live
    finally:
        live.stop()
        redis.kill()


def test_a_worker_killed_mid_stream(stack):
    async def scenario():
        tasks, _ = await streaming_clients(stack, 6)
        await asyncio.sleep(0.5)
        fault_at = time.monotonic()
        stack.kill_worker("w1@faults")
        return await asyncio.gather(*tasks), fault_at

    ends, fault_at = asyncio.run(scenario())
    assert_ended_in_time(ends, fault_at)
    errors = [e for e in ends if e["type"] == "error"]
    assert errors and all("w1@faults stopped responding" in e["message"] for e in errors)
    assert all(e["worker"] == "w2@faults" for e in ends if e["type"] == "done")
    new_requests_work(stack)
    assert_no_slot_held(stack.redis)
    assert_idle_without_blocks(stack, "w2@faults")


async def feed_frames(ws, until: str, timeout: float = 30) -> list[dict]:
    """A demo socket's frames up to and including the first of type `until` (a close raises)."""
    frames = []
    while not frames or frames[-1]["type"] != until:
        frames.append(json.loads(await asyncio.wait_for(ws.recv(), timeout)))
    return frames


def test_redis_killed_and_restarted_mid_stream(stack):
    async def scenario():
        demo_url = stack.ws_url.replace("/ws/chat/", "/ws/demo/")
        async with connect(demo_url, origin=stack.base_url, proxy=None, open_timeout=30) as demo:
            tasks, _ = await streaming_clients(stack, 6)
            fault_at = time.monotonic()
            stack.redis.kill()
            ends = await asyncio.gather(*tasks)
            lost = await feed_frames(demo, "error")  # the demo page's feed: a frame, not a 1011 close
            stack.redis.start()
            back = await feed_frames(demo, "ack", timeout=60)
        return ends, fault_at, lost[-1], back

    ends, fault_at, lost, back = asyncio.run(scenario())
    assert "channel layer is unavailable" in lost["message"]
    assert back[-1]["message"] == "live updates resumed"
    assert any(frame["type"] == "state" for frame in back)  # the page gets the run's state again
    assert_ended_in_time(ends, fault_at)  # each an error frame or its reply; a 1011 close would have raised
    errors = [e for e in ends if e["type"] == "error"]
    assert errors and all(e.get("request_id") for e in errors), ends
    stack.wait_workers_ready(60)  # heartbeats are back in the empty Redis
    new_requests_work(stack)
    assert_no_slot_held(stack.redis)
    for worker in ("w1@faults", "w2@faults"):
        assert_idle_without_blocks(stack, worker)


def test_the_engine_loop_raising_mid_stream(stack):
    async def scenario():
        tasks, _ = await streaming_clients(stack, 6)
        fault_at = time.monotonic()
        stack.fault_flag.touch()
        return await asyncio.gather(*tasks), fault_at

    ends, fault_at = asyncio.run(scenario())
    assert_ended_in_time(ends, fault_at)
    errors = [e for e in ends if e["type"] == "error"]
    assert errors and all(e["message"].startswith("generation failed") for e in errors), errors
    assert all(e["worker"] == "w2@faults" for e in ends if e["type"] == "done")
    stack.wait(lambda: {w["name"]: w["state"] for w in stack.health()["workers"]}.get("w1@faults") == "failed",
               10, "w1 to report its engine failed")
    time.sleep(2)  # w1 has stopped consuming: the new requests go to w2
    new_requests_work(stack, 4)
    assert_no_slot_held(stack.redis)
    assert_idle_without_blocks(stack, "w2@faults")
