"""The worker runtime's lock and the event loop: an abort that arrives while another request is being
admitted slowly must not hold up the tokens of every other request on the worker (the loop carries them all).
The real runtime, engine service and in-memory channel layer around the scripted engine (fake_worker.py)."""
import asyncio
import threading
import time

import pytest
from django.conf import settings
from fake_engine import FakeStreamingEngine
from fake_worker import connect, generate, until_end, worker

from playground.celery import app as celery_app
from playground.serving.shared import registry
from playground.serving.shared.envelope import Job
from playground.serving.shared.naming import GPU_QUEUE, TASK_NAME
from playground.serving.worker import runtime as runtime_module
from playground.serving.worker import tasks
from playground.serving.worker.bridge import LoopBridge
from playground.serving.worker.engine_service import EngineService
from playground.serving.worker.runtime import WorkerRuntime

pytestmark = pytest.mark.django_db(transaction=True)

ALLOWED_DELAY_S = 0.05  # beyond the coalescing window, a token frame may be this late


def test_abort_during_a_slow_submit_does_not_delay_other_streams(monkeypatch):
    async def scenario():
        async with worker(monkeypatch, delay=0.01) as (engine, _):
            streaming = await connect()
            await streaming.send_json_to(generate([{"role": "user", "content": "z" * 400}], max_tokens=400))
            await streaming.receive_json_from(timeout=5)  # started
            assert (await streaming.receive_json_from(timeout=5))["type"] == "token"

            slow = await connect()
            await slow.send_json_to(generate([{"role": "user", "content": "SLOW please"}], max_tokens=50))
            slow_started = await slow.receive_json_from(timeout=5)
            await asyncio.sleep(0.2)  # its task thread is now inside submit
            await slow.send_json_to({"type": "cancel", "request_id": slow_started["request_id"]})

            arrivals = []
            window_end = time.monotonic() + engine.slow_admission_s
            while time.monotonic() < window_end:
                frame = await streaming.receive_json_from(timeout=5)
                assert frame["type"] == "token"
                arrivals.append(time.monotonic())
            slow_frames = await until_end(slow)
            await streaming.send_json_to({"type": "cancel", "request_id": frame["request_id"]})
            await until_end(streaming)
            for ws in (streaming, slow):
                await ws.disconnect()
            return arrivals, slow_started, slow_frames, engine

    arrivals, slow_started, slow_frames, engine = asyncio.run(scenario())
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) > 10
    assert max(gaps) < settings.PLAYGROUND_COALESCE_MS / 1000 + ALLOWED_DELAY_S, max(gaps)
    # The abort was not lost either: it came before the request was live, and was applied once it was.
    done = slow_frames[-1]
    assert done["type"] == "done" and done["outputs"][0]["finish_reason"] == "abort"
    assert slow_started["request_id"] in engine.aborted



def test_a_worker_says_it_is_ready_as_soon_as_its_engine_has_loaded(settings):
    """Not a heartbeat interval later: dispatch routes, and /health answers, by the registry entry, whose last
    heartbeat read the engine still loading."""
    settings.PLAYGROUND_HEARTBEAT_INTERVAL = 60
    release = threading.Event()

    def slow_factory(**kwargs):
        release.wait(5)
        return FakeStreamingEngine(0.01)

    async def scenario():
        rt = WorkerRuntime("loading@test", EngineService({}, engine_factory=slow_factory),
                           LoopBridge(asyncio.get_running_loop()))
        rt.start()
        try:
            deadline = time.monotonic() + 5
            while (registry.get(rt.name) or {}).get("state") != "loading" and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert registry.get(rt.name)["state"] == "loading"  # the heartbeat's one beat for a minute
            release.set()
            await asyncio.to_thread(rt.service.wait_ready, 5)
            while registry.get(rt.name)["state"] != "ready" and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert registry.get(rt.name)["state"] == "ready"
        finally:
            release.set()
            await asyncio.to_thread(rt.stop)

    asyncio.run(scenario())
    assert registry.get("loading@test") is None  # stop took it out


def test_a_heartbeat_read_before_the_drain_never_overwrites_its_draining_entry(monkeypatch):
    """The heartbeat thread reads the worker's state, SIGTERM starts the drain, which writes "draining"; the
    heartbeat's older reading must not be written after it, or dispatch sends sticky follow-ups to a leaving
    worker (the race that failed tests/playground/test_drain.py in CI)."""
    service = EngineService({}, engine_factory=lambda **kwargs: FakeStreamingEngine(0.01))
    rt = WorkerRuntime("race@test", service, LoopBridge(None))  # not started: only its registry writes matter
    reading, release = threading.Event(), threading.Event()
    written: list[str] = []
    heartbeat, real_beat = rt.heartbeat, registry.beat

    def stale_heartbeat():
        info = heartbeat()
        if threading.current_thread().name == "stale-beat":
            reading.set()
            release.wait(5)  # the drain begins while this reading is in hand
        return info

    monkeypatch.setattr(rt, "heartbeat", stale_heartbeat)
    monkeypatch.setattr(registry, "beat", lambda info: (written.append(info["state"]), real_beat(info)))
    stale = threading.Thread(target=rt.beat, name="stale-beat")
    stale.start()
    assert reading.wait(5)
    rt.drain.started.set()  # what Drain.begin does before its announce
    announce = threading.Thread(target=rt.beat)
    announce.start()
    time.sleep(0.2)
    release.set()
    for thread in (stale, announce):
        thread.join(5)
    try:
        assert written == ["loading", "draining"], written
        assert registry.get(rt.name)["state"] == "draining"
    finally:
        registry.forget(rt.name)


@pytest.mark.parametrize("other_state", ["ready", "draining", None])
def test_a_draining_worker_passes_a_fetched_task_to_another_ready_worker(monkeypatch, other_state):
    """Celery's fetch, already waiting on the queues when SIGTERM came, can hand a draining worker a task sent
    after its registry entry said draining (it failed tests/playground/test_drain.py): the task goes back to the
    shared queue when another worker is ready, and is served here when none is (a lone worker must not bounce
    it to itself). Before the drain every task is served here."""
    service = EngineService({}, engine_factory=lambda **kwargs: FakeStreamingEngine(0.01))
    rt = WorkerRuntime("leaving@test", service, LoopBridge(None))  # not started: only the routing matters
    monkeypatch.setattr(runtime_module, "_runtime", rt)
    sent, served = [], []
    monkeypatch.setattr(celery_app, "send_task", lambda name, **kwargs: sent.append((name, kwargs)))
    monkeypatch.setattr(rt, "serve", lambda request_id, job: served.append((request_id, job)))
    job = Job({"max_tokens": 4}, messages=[{"role": "user", "content": "hi"}]).to_task()
    if other_state is not None:
        registry.beat({"name": "other@test", "state": other_state})
    try:
        tasks.generate("before", job)
        rt.drain.started.set()  # what Drain.begin does first
        tasks.generate("after", job)
    finally:
        registry.forget("other@test")
    assert served[0] == ("before", Job.from_task(job))
    if other_state == "ready":
        assert served == served[:1]
        ((name, options),) = sent
        assert (name, options["kwargs"], options["queue"], options["task_id"]) == (
            TASK_NAME, {"request_id": "after", "job": job}, GPU_QUEUE, "after")
    else:
        assert [request_id for request_id, _ in served] == ["before", "after"] and sent == []


def test_requests_ending_together_share_one_registry_rewrite_read_after_they_ended(monkeypatch):
    """Before its `done` a request makes the worker's registry entry one read after it left the engine (sticky
    routing of the follow-up reads it). Requests ending while a rewrite is under way wait for one rewrite that
    begins after them, and share it; a rewrite that began before them does not count."""
    service = EngineService({}, engine_factory=lambda **kwargs: FakeStreamingEngine(0.01))
    rt = WorkerRuntime("share@test", service, LoopBridge(None))  # not started: only its registry writes matter
    reading, release = threading.Event(), threading.Event()
    reads: list[float] = []
    heartbeat = rt.heartbeat

    def recorded_heartbeat():
        reads.append(time.monotonic())
        if len(reads) == 1:
            reading.set()
            release.wait(5)  # the others end while this rewrite is under way
        return heartbeat()

    monkeypatch.setattr(rt, "heartbeat", recorded_heartbeat)
    first = threading.Thread(target=rt.beat_since_now)
    first.start()
    assert reading.wait(5)
    ended_at = time.monotonic()
    together = [threading.Thread(target=rt.beat_since_now) for _ in range(8)]
    for thread in together:
        thread.start()
    time.sleep(0.2)
    release.set()
    for thread in (first, *together):
        thread.join(5)
    try:
        assert len(reads) == 2 and reads[1] > ended_at, reads
        rt.beat_since_now()  # a request ending later gets a rewrite of its own
        assert len(reads) == 3
    finally:
        registry.forget(rt.name)
