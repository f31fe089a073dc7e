"""A GPU worker's runtime: one engine, one channel-layer loop, heartbeats and the abort listener.

Celery starts it through the `worker_init` signal (CLI workers and the embedded in-process worker alike).
Nothing here blocks Celery: the model loads in its own thread, and tasks wait for it. Each Celery task
thread serves one request through `WorkerRuntime.serve`: it submits the request and hands the stream to the
worker's one token publisher (coalesce.py), which sends the coalesced deltas to the request's web process
from the event loop; once the publisher has sent the last text, the thread posts `gen.done` (or `gen.error`)
to the publisher too, which sends it with its next message to that web process.

What the channel in the request's `Job.reply_to` receives (its web process's inbox, serving/web/inbox.py,
which hands the events to the request's lifecycle): `gen.batch` {events: [...]} messages, each carrying the
events of that web process's requests due at one wake-up of the publisher: `gen.accepted` {request_id,
worker}, `gen.tokens` {request_id, prompt_tokens, chunks: [{index, seq, text, tokens}]}, `gen.done`
{request_id, worker, outputs, usage, timing} (a tokenizer job's with its answer too), `gen.error` {request_id,
message, code}, where `code` is "invalid_request" (the engine refused the request), "unavailable" (no
engine) or "server_error". A request's events arrive in the order it sent them.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from celery.signals import celeryd_after_setup, worker_init, worker_shutdown, worker_shutting_down
from channels.layers import get_channel_layer
from django.conf import settings

from playground import logs

from ..shared import registry
from ..shared.envelope import Job
from .bridge import LoopBridge
from .coalesce import TokenPublisher
from .drain import Drain
from .engine_service import EngineService, EngineUnavailable
from .kv_publisher import SnapshotPublisher
from .lab_host import LabHost
from ..shared.naming import CONTROL_GROUP, GPU_QUEUE, WORKER_CHANNEL_PREFIX, worker_queue

logger = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 600.0  # a task waits this long for the model to load
ABORT_MEMORY_S = 300.0  # aborts of requests not seen yet are remembered this long
CONTROL_REJOIN_S = 3600.0  # channel-layer group memberships expire; renew well before


class WorkerRuntime:
    def __init__(self, name: str, service: EngineService, bridge: LoopBridge) -> None:
        self.name = name
        self.queue = worker_queue(name)
        self.service = service
        self.bridge = bridge
        # Guards the three request sets below and nothing else: held for a few set operations, never across a
        # call into the engine and never on the event loop (aborts reach it through `_aborter`).
        self._lock = threading.Lock()
        self._live: set[str] = set()  # requests in the engine (abortable)
        self._serving: set[str] = set()  # from before `gen.accepted` until after `gen.done` / `gen.error`
        self._early_aborts: dict[str, float] = {}
        self._stopping = threading.Event()
        self._beat_now = threading.Event()  # wakes the heartbeat thread before its interval is up
        self._abort_listener: Future | None = None
        self._aborter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-abort")
        # Serialises registry writes: a heartbeat read before the drain began must not land after the drain's
        # "draining" entry and put "ready" back (dispatch would then route sticky follow-ups to a leaving worker).
        self._beat_lock = threading.Lock()
        self._beat_started = 0.0  # time.monotonic() when the last rewrite began reading the worker's state
        self.publisher = SnapshotPublisher(name, service, bridge, settings.PLAYGROUND_KV_SNAPSHOT_MS / 1000)
        self.tokens = TokenPublisher(bridge, settings.PLAYGROUND_COALESCE_MS / 1000,
                                     paced_events_per_s=settings.PLAYGROUND_WS_FRAMES_PER_S)
        self.labs = LabHost(name, service, bridge, **settings.PLAYGROUND_LAB)
        self.drain = Drain(settings.PLAYGROUND_DRAIN_S, self._serving_now, self.abort, self.beat)

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self.bridge.start()
        threading.Thread(target=self._load, name="engine-load", daemon=True).start()
        threading.Thread(target=self._heartbeat_loop, name="worker-heartbeat", daemon=True).start()
        self._abort_listener = self.bridge.submit(self._listen_for_aborts())
        self.publisher.start()
        self.labs.start()

    def _load(self) -> None:
        """Load the engine and have the heartbeat say so at once: its entry may still read "loading" for up to
        an interval, and dispatch routes (and /health answers) by the entry; a failed load stops consuming at once.
        Then freeze the heap: the model's, Django's and the modules' objects live as long as the process, and
        scanning them in every full garbage collection paused all threads, the engine's and the event loop's, for
        50-250 ms a few times a minute under load (measured with `python -m bench.serving`)."""
        self.service.load()
        self._beat_now.set()
        gc.collect()
        gc.freeze()

    def stop(self) -> None:
        self._stopping.set()
        self._beat_now.set()
        self.publisher.stop()
        self.labs.stop()
        if self._abort_listener is not None:
            self._abort_listener.cancel()
        self._aborter.shutdown(wait=False)
        try:
            registry.forget(self.name)
        except Exception:
            logger.exception("could not remove the worker's heartbeat")
        self.service.shutdown()
        self.bridge.stop()
        gc.unfreeze()  # let the interpreter's last collection free them (triton's bindings report leaks otherwise)

    def heartbeat(self) -> dict[str, Any]:
        with self._lock:
            serving = sorted(self._serving)
        return {
            "name": self.name,
            "queue": self.queue,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "state": "draining" if self.drain.started.is_set() else self.service.state,
            "health": self.service.health(),
            "requests": serving,  # the web side tells a lost reply from a slow one by this
            "metrics": self.service.metrics(),
            "model": settings.PLAYGROUND_ENGINE["model"],
            "max_model_len": self.service.max_model_len,  # the web side's window (web/models.py)
            "suggested_sampling": self.service.suggested_sampling,  # the API's defaults (web/models.py)
            "latency": self.publisher.latency.export(),  # histograms for /metrics (dashboard/prometheus.py)
            "finished": self.publisher.latency.finish_reasons(),  # vllm:request_success_total
            "labs": {"sessions": self.labs.num_sessions, "max_sessions": self.labs.max_sessions},
        }

    def _serving_now(self) -> set[str]:
        with self._lock:
            return set(self._serving)

    def beat(self) -> dict[str, Any]:
        """Rewrite this worker's registry entry now, and return it."""
        with self._beat_lock:
            return self._rewrite_entry()

    def beat_since_now(self) -> None:
        """Make the registry entry one read after this call began: rewrite it, unless a rewrite that began
        later has already been written. Requests that end in one engine step share a rewrite instead of
        queueing 64 of them on the lock before their `done` frames."""
        asked = time.monotonic()
        with self._beat_lock:
            if self._beat_started <= asked:
                self._rewrite_entry()

    def _rewrite_entry(self) -> dict[str, Any]:
        """Read the worker's state and write it to the registry (the caller holds `_beat_lock`)."""
        self._beat_started = time.monotonic()
        beat = self.heartbeat()
        registry.beat(beat)
        return beat

    def _heartbeat_loop(self) -> None:
        interval = settings.PLAYGROUND_HEARTBEAT_INTERVAL
        consuming = True
        while not self._stopping.is_set():
            try:
                beat = self.beat()
                if consuming and beat["state"] == "failed":
                    consuming = False
                    self._stop_consuming(beat["health"]["error"])
            except Exception:
                logger.exception("heartbeat failed")
            self._beat_now.wait(interval)
            self._beat_now.clear()

    def _stop_consuming(self, why: str | None) -> None:
        """The engine cannot serve: take no more tasks, so they go to healthy workers. (Tasks already
        delivered are refused at once with "unavailable"; the heartbeat keeps telling everyone why.)"""
        from playground.celery import app

        logger.error("engine unhealthy (%s): no longer consuming %s and %s", why, GPU_QUEUE, self.queue)
        for queue in (GPU_QUEUE, self.queue):
            app.control.cancel_consumer(queue, destination=[self.name])

    async def _listen_for_aborts(self) -> None:
        """Serve `gen.abort` messages of the control group for the worker's life, surviving layer errors."""
        layer = get_channel_layer()
        while True:
            try:
                await self._receive_aborts(layer)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("abort listener failed; joining the control group again")
                await asyncio.sleep(1)

    async def _receive_aborts(self, layer) -> None:
        channel = await layer.new_channel(WORKER_CHANNEL_PREFIX)
        loop = asyncio.get_running_loop()
        rejoin_at = 0.0
        while True:
            if loop.time() >= rejoin_at:
                await layer.group_add(CONTROL_GROUP, channel)
                rejoin_at = loop.time() + CONTROL_REJOIN_S
            message = await layer.receive(channel)
            if message.get("type") == "gen.abort" and isinstance(message.get("request_id"), str):
                # Handed to the abort thread: the loop also carries every request's tokens, and must not wait
                # for the lock or the engine.
                self._aborter.submit(self.abort, message["request_id"])
            else:
                self.publisher.control(message)  # the dashboard's refresh and reset-prefix-cache requests

    # --- requests ---------------------------------------------------------------------------------
    def abort(self, request_id: str) -> None:
        """Abort a live request, or remember the abort for a request being admitted or not seen yet (the
        admitting thread, or a later `serve`, acts on it). Blocking: never call it on the event loop."""
        with self._lock:
            live = request_id in self._live
            if not live:
                now = time.monotonic()
                self._early_aborts = {r: t for r, t in self._early_aborts.items() if now - t < ABORT_MEMORY_S}
                self._early_aborts[request_id] = now
        if live:
            self.service.abort(request_id)

    def passes_on_new_work(self) -> bool:
        """Whether a task reaching this worker now belongs to another: it is draining and another worker is
        ready. Celery's fetch already waiting on the queues when SIGTERM came can still hand a draining worker
        a task sent after its registry entry said draining. With no other worker ready it serves the task in
        its drain time instead (a lone worker would otherwise bounce it to itself)."""
        if not self.drain.started.is_set():
            return False
        return any(w.get("name") != self.name and w.get("state") == "ready" for w in registry.live_workers())

    def serve(self, request_id: str, job: Job) -> None:
        """Run one request to its end, its text streamed to `job.reply_to` by the token publisher (blocking:
        runs in a Celery task thread). `gen.done` goes out once the publisher has sent the last text."""
        if not job.reply_to:
            raise ValueError(f"request {request_id} names no channel to reply to (Job.reply_to)")

        def send(message: dict[str, Any]) -> None:
            """With the token publisher's next message to the web process (coalesce.py says why)."""
            self.tokens.deliver(job.reply_to, {"request_id": request_id, **message})

        bound = logs.request_id.set(request_id)  # this task thread's log lines, the engine call's included
        with self._lock:
            self._serving.add(request_id)
        try:
            # Not waited for, and held: it leads the request's first message or the next one to its web process
            # (coalesce.py); a failed send fails that one too.
            self.tokens.post(job.reply_to, {"request_id": request_id, "type": "gen.accepted", "worker": self.name},
                             hold=True)
            if job.kind == "generate":
                self._run(request_id, job, send)
            else:
                self._tokenize(request_id, job, send)
        finally:
            with self._lock:
                self._serving.discard(request_id)
            logs.request_id.reset(bound)

    def _run(self, request_id: str, job: Job, send: Callable[[dict[str, Any]], None]) -> None:
        try:
            self.service.wait_ready(LOAD_TIMEOUT_S)
            with self._lock:
                aborted = self._early_aborts.pop(request_id, None) is not None
            if aborted:
                self._finish(request_id, nothing_generated(job.params["n"]), send)
                return
            # Outside the lock: submitting tokenises, may read an adapter from disk and builds a grammar.
            stream = self.service.submit(request_id, job)
            with self._lock:
                self._live.add(request_id)
                aborted = self._early_aborts.pop(request_id, None) is not None
            if aborted:  # the abort came while it was being submitted, before it was live
                self.service.abort(request_id)
        except ValueError as exc:  # the engine refused this request (too long, empty...): the client's fault
            send({"type": "gen.error", "message": str(exc), "code": "invalid_request"})
            return
        except EngineUnavailable as exc:
            send({"type": "gen.error", "message": str(exc), "code": "unavailable"})
            return
        try:
            self.tokens.stream(request_id, stream, job.reply_to, job.paced)
            done = self.service.result(stream)
        except Exception as exc:
            logger.exception("request %s failed", request_id)
            self.service.abort(request_id)
            send({"type": "gen.error", "message": f"generation failed: {exc}", "code": "server_error"})
            return
        finally:
            with self._lock:
                self._live.discard(request_id)
        self.publisher.observe(stream.final.metrics)
        self.publisher.latency.count_finished([output["finish_reason"] for output in done["outputs"]])
        try:
            # Before `done`: a follow-up turn the client sends on it is routed by this entry (dispatch.py), which
            # must not still show the queue of up to a second ago, when this request was waiting.
            self.beat_since_now()
        except Exception:
            logger.exception("heartbeat failed")
        self._finish(request_id, done, send)

    def _tokenize(self, request_id: str, job: Job, send: Callable[[dict[str, Any]], None]) -> None:
        """vLLM's /tokenize and /detokenize: the tokenizer's answer in the `done` payload, beside an empty
        generation (no outputs, no usage), so it travels the lifecycle a generation does. No engine request."""
        try:
            self.service.wait_ready(LOAD_TIMEOUT_S)
            answer = self.service.tokenize(job)
        except ValueError as exc:  # input the tokenizer refuses (an id outside the vocabulary...)
            send({"type": "gen.error", "message": str(exc), "code": "invalid_request"})
            return
        except EngineUnavailable as exc:
            send({"type": "gen.error", "message": str(exc), "code": "unavailable"})
            return
        self._finish(request_id, {**nothing_generated(0), **answer}, send)

    def _finish(self, request_id: str, done: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> None:
        """Send `gen.done`, or the error frame of a request the drain cut (its partial reply is not an answer)."""
        if self.drain.was_cut(request_id):
            send({"type": "gen.error", "code": "unavailable", "message": "the worker shut down before this "
                  f"request finished (it had {self.drain.seconds} s to drain); please retry"})
            return
        send({"type": "gen.done", "worker": self.name, **done})


def nothing_generated(n: int) -> dict[str, Any]:
    """The `done` payload of a request the engine never saw: cancelled before it started (its `n` samples
    aborted), or a tokenizer job (n = 0)."""
    return {
        "outputs": [{"index": i, "text": "", "finish_reason": "abort", "completion_tokens": 0} for i in range(n)],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0},
        "timing": {"ttft_ms": None, "tokens_per_s": None},
    }


# --- process-wide wiring ------------------------------------------------------------------------------
_runtime: WorkerRuntime | None = None
_shared_loop: asyncio.AbstractEventLoop | None = None


def use_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Make the next runtime send through `loop` (the embedded server's loop) instead of its own thread."""
    global _shared_loop
    _shared_loop = loop


def exists() -> bool:
    """Whether this process runs a GPU worker runtime (`current` returns it)."""
    return _runtime is not None


def current() -> WorkerRuntime:
    if _runtime is None:
        raise RuntimeError("no GPU worker runtime in this process: run tasks in `celery -A playground worker`")
    return _runtime


@worker_init.connect
def _start_runtime(sender, **kwargs) -> None:
    global _runtime
    if "prefork" in str(getattr(sender, "pool_cls", "")).lower():
        # SystemExit, because Celery logs and swallows ordinary exceptions raised by signal handlers.
        raise SystemExit("GPU workers share one engine per process: run them on threads (leave out --pool: the "
                         "playground's pool is the default)")
    service = EngineService(settings.PLAYGROUND_ENGINE, lora_modules=settings.PLAYGROUND_LORA_MODULES)
    _runtime = WorkerRuntime(sender.hostname, service, LoopBridge(_shared_loop))
    _runtime.start()


@celeryd_after_setup.connect
def _consume_own_queue(sender: str, instance, **kwargs) -> None:
    instance.app.amqp.queues.select_add(worker_queue(sender))


@worker_shutting_down.connect
def _drain_runtime(sender, sig: str = "", how: str = "", **kwargs) -> None:
    """SIGTERM (Celery's warm shutdown): drain. A cold shutdown (a second signal, SIGQUIT) waits for nothing."""
    if _runtime is not None and how == "Warm":
        _runtime.drain.begin()


@worker_shutdown.connect
def _stop_runtime(**kwargs) -> None:
    global _runtime
    if _runtime is not None:
        _runtime.stop()
        _runtime = None
