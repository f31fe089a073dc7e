"""The lab over its socket: LabConsumer relays a presenter's commands to the worker's LabHost (real sandbox
engines on the real model, sharing one set of weights) and the replies back; two presenters get separate
pools; bad commands get error frames; idle labs are closed; a worker at its lab limit gets no new lab."""
import asyncio
import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from channels.testing import WebsocketCommunicator
from test_consumer import ORIGIN

from inference.lab import LabConfig, LabSession
from playground.asgi import application
from playground.lab.consumers import pick_worker
from playground.serving.shared import registry
from playground.serving.worker.bridge import LoopBridge
from playground.serving.worker.lab_host import LabHost

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def base_engine():
    """The 'worker's engine' whose weights every sandbox shares (loaded once for the module)."""
    return LabSession(LabConfig()).engine


class EngineLoop:
    """What a LabHost uses of the worker's StreamingEngine: its engine, and background calls run one at a
    time on one thread (the loop's)."""
    _thread = ThreadPoolExecutor(1)

    def __init__(self, engine) -> None:
        self.engine = engine

    def call_in_background(self, fn):
        return self._thread.submit(fn, self.engine)


@contextlib.asynccontextmanager
async def lab_worker(base_engine, max_sessions=4, idle_s=600.0):
    """A LabHost on this test's event loop, announced in the registry as worker 'w1'."""
    service = SimpleNamespace(wait_ready=lambda timeout=None: EngineLoop(base_engine))
    host = LabHost("w1@test", service, LoopBridge(asyncio.get_running_loop()), idle_s, max_sessions)
    host.start()
    await asyncio.sleep(0.05)  # the listener joins its group
    registry.beat({"name": "w1@test", "state": "ready",
                   "labs": {"sessions": 0, "max_sessions": max_sessions}})
    try:
        yield host
    finally:
        host.stop()


async def connect() -> WebsocketCommunicator:
    ws = WebsocketCommunicator(application, "/ws/lab/", headers=[ORIGIN])
    connected, _ = await ws.connect(timeout=5)
    assert connected
    return ws


def run_async(test):
    """Run an async test body in its own event loop (as the other consumer tests do with asyncio.run)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


async def reply(ws, timeout=60.0) -> dict:
    return await ws.receive_json_from(timeout=timeout)


def test_pick_worker_prefers_room():
    workers = [{"name": "a", "state": "ready", "labs": {"sessions": 2, "max_sessions": 2}},
               {"name": "b", "state": "loading", "labs": {"sessions": 0, "max_sessions": 2}},
               {"name": "c", "state": "ready", "labs": {"sessions": 1, "max_sessions": 2}},
               {"name": "d", "state": "ready"}]
    assert pick_worker(workers) == "c"
    assert pick_worker(workers[:2]) is None


@pytest.mark.slow
@run_async
async def test_a_scenario_steps_to_its_quiz_over_the_socket(base_engine):
    async with lab_worker(base_engine):
        ws = await connect()
        await ws.send_json_to({"type": "open", "scenario": "parallel_sampling"})
        ready = await reply(ws)
        assert ready["type"] == "ready" and ready["scenario"]["name"] == "parallel_sampling"
        assert ready["limits"]["num_blocks"] == [8, 64]
        assert {s["name"] for s in ready["scenarios"]} >= {"fragmentation", "preemption", "lru_eviction"}
        assert "answer" not in str(ready["scenarios"])  # the page is told the question, not the answer
        await ws.send_json_to({"type": "answer", "guess": 1})
        assert "not due yet" in (await reply(ws))["message"]
        snapshots = []
        for _ in range(2):
            await ws.send_json_to({"type": "step"})
            snapshots.append((await reply(ws))["snapshot"])
        held = {b for seq in snapshots[-1]["requests"][0]["seqs"] for b in seq["block_table"]}
        assert snapshots[-1]["quiz_due"] and snapshots[-1]["step"] == 2
        await ws.send_json_to({"type": "answer", "guess": len(held)})
        verdict = await reply(ws)
        assert verdict == {"type": "quiz", "correct": True, "answer": len(held)}
        await ws.send_json_to({"type": "recording"})
        recording = (await reply(ws))["recording"]
        assert recording["num_blocks"] == 32 and any(e["kind"] == "forked" for e in recording["events"])
        await ws.disconnect()


@pytest.mark.slow
@run_async
async def test_two_presenters_never_see_each_others_pools(base_engine):
    async with lab_worker(base_engine) as host:
        first, second = await connect(), await connect()
        await first.send_json_to({"type": "open", "config": {"num_blocks": 16}})
        await second.send_json_to({"type": "open", "config": {"num_blocks": 24}})
        assert (await reply(first))["snapshot"]["config"]["num_blocks"] == 16
        assert (await reply(second))["snapshot"]["config"]["num_blocks"] == 24
        await first.send_json_to({"type": "add", "prompt": "Hello there, friend", "max_tokens": 4})
        assert (await reply(first))["snapshot"]["requests"][0]["label"] == "A"
        await first.send_json_to({"type": "step"})
        mine = (await reply(first))["snapshot"]
        await second.send_json_to({"type": "step"})
        theirs = (await reply(second))["snapshot"]
        assert mine["counters"]["num_blocks_used"] > 0 and theirs["counters"]["num_blocks_used"] == 0
        assert theirs["requests"] == [] and len(theirs["blocks"]) == 24
        assert first.output_queue.empty() and second.output_queue.empty()  # nothing crossed over
        assert host.num_sessions == 2
        await first.disconnect()
        await second.disconnect()
        for _ in range(100):  # the close commands reach the lab thread
            if host.num_sessions == 0:
                break
            await asyncio.sleep(0.05)
        assert host.num_sessions == 0


@pytest.mark.slow
@run_async
async def test_bad_commands_get_error_frames_and_lose_nothing(base_engine):
    async with lab_worker(base_engine, max_sessions=1) as host:
        ws = await connect()
        await ws.send_json_to({"type": "step"})
        assert "open a lab first" in (await reply(ws))["message"]
        await ws.send_json_to({"type": "launch"})
        assert "type must be one of" in (await reply(ws))["message"]
        await ws.send_json_to({"type": "open", "config": {"num_blocks": 4}})
        assert "num_blocks must be an integer in [8, 64]" in (await reply(ws))["message"]
        await ws.send_json_to({"type": "open", "config": {"blocks": 16}})
        assert "unknown field(s): blocks" in (await reply(ws))["message"]
        await ws.send_json_to({"type": "open", "scenario": "nope"})
        assert "unknown scenario" in (await reply(ws))["message"]
        await ws.send_json_to({"type": "open", "config": {}})
        assert (await reply(ws))["type"] == "ready"
        for bad, needle in [({"prompt": ""}, "non-empty prompt"), ({"prompt": "x", "n": 99}, "n must be"),
                            ({"prompt": "x", "colour": 1}, "unknown field"), ({"label": "Q"}, None)]:
            frame = {"type": "abort", **bad} if "label" in bad else {"type": "add", **bad}
            await ws.send_json_to(frame)
            message = (await reply(ws))["message"]
            assert needle is None or needle in message
        session = host.labs[next(iter(host.labs))].session
        assert session.requests == {} and session.is_idle()
        registry.beat({"name": "w1@test", "state": "ready", "labs": {"sessions": 1, "max_sessions": 1}})
        other = await connect()
        await other.send_json_to({"type": "open", "config": {}})
        assert "no worker has room for a lab" in (await reply(other))["message"]
        await ws.disconnect()
        await other.disconnect()


@pytest.mark.slow
@run_async
async def test_an_idle_lab_is_closed(base_engine):
    async with lab_worker(base_engine, idle_s=0.5) as host:
        ws = await connect()
        await ws.send_json_to({"type": "open", "config": {}})
        assert (await reply(ws))["type"] == "ready"
        lab = next(iter(host.labs.values()))
        lab.last_used = time.monotonic() - 10
        await ws.send_json_to({"type": "step"})  # the sweep before this command closes the lab
        closed = await reply(ws)
        assert closed["type"] == "closed" and "idle" in closed["message"]
        assert "not open" in (await reply(ws))["message"] and host.num_sessions == 0
        await ws.disconnect()
