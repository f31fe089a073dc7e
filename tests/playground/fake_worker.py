"""The worker side for consumer, limits, demo and fault tests without a model: the real worker runtime,
engine service and in-memory channel layer around a FakeStreamingEngine (fake_engine.py), run as in the
embedded mode (its sends go through the test's event loop; each "Celery task" is a thread running
`WorkerRuntime.serve`), plus websocket helpers for /ws/chat/.
"""
import asyncio
import contextlib
import json
import threading

from channels.testing import WebsocketCommunicator
from fake_engine import FakeStreamingEngine

from playground.asgi import application
from playground.serving.shared.envelope import Job
from playground.serving.shared.naming import GPU_QUEUE
from playground.serving.web import dispatch
from playground.serving.worker.bridge import LoopBridge
from playground.serving.worker.engine_service import EngineService
from playground.serving.worker.runtime import WorkerRuntime

ORIGIN = (b"origin", b"http://127.0.0.1")
ASK = [{"role": "user", "content": "hi there"}]


@contextlib.asynccontextmanager
async def worker(monkeypatch, delay: float = 0.002, name: str = "fake@test", lora_modules=None,
                 suggested_sampling: dict | None = None):
    """A worker runtime around a FakeStreamingEngine; dispatch's sends (`submit_many`) run its tasks in threads.
    `lora_modules` (adapter name -> path) as the worker's PLAYGROUND_LORA_MODULES; `suggested_sampling` as its
    model's generation_config.json suggests."""
    engine = FakeStreamingEngine(delay, suggested_sampling=suggested_sampling)
    service = EngineService({}, engine_factory=lambda **kwargs: engine, lora_modules=lora_modules)
    runtime = WorkerRuntime(name, service, LoopBridge(asyncio.get_running_loop()))
    runtime.start()
    await asyncio.to_thread(service.wait_ready, 10)
    # The registry entry says "ready" before the test talks to the web side: wait_ready returns once the engine
    # has loaded, a moment before the runtime's own beat says so.
    await asyncio.to_thread(runtime.beat)
    submitted: list[dict] = []
    tasks: list[threading.Thread] = []

    def submit_many(jobs):
        for request_id, job in jobs:
            submitted.append({"request_id": request_id, "preferred_worker": job.preferred_worker,
                              "adapter": job.adapter, "fit_window": job.fit_window, "job": job})
            # Through the task's JSON, as Celery carries it.
            task = Job.from_task(json.loads(json.dumps(job.to_task())))
            tasks.append(threading.Thread(target=runtime.serve, daemon=True, args=(request_id, task)))
            tasks[-1].start()
        return [GPU_QUEUE] * len(jobs)

    monkeypatch.setattr(dispatch, "submit_many", submit_many)
    try:
        yield engine, submitted
    finally:
        for task in tasks:  # their last messages go through this test's loop: let them finish while it runs
            await asyncio.to_thread(task.join, 5)
        await asyncio.to_thread(runtime.stop)


async def connect(headers=(ORIGIN,)) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, "/ws/chat/", headers=list(headers))
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    return communicator


async def until_end(communicator: WebsocketCommunicator, timeout: float = 5) -> list[dict]:
    """Frames up to and including the first done or error."""
    frames = []
    while True:
        frame = await communicator.receive_json_from(timeout=timeout)
        frames.append(frame)
        if frame["type"] in ("done", "error"):
            return frames


def generate(messages=ASK, **params) -> dict:
    return {"type": "generate", "messages": messages, "params": {"temperature": 0, **params}}


