"""`python -m bench.request_timeline`: where a streamed API request's time to first token goes, phase by phase, on
the embedded stack under load (issue 41).

It serves the playground in this process, as `bin/playground` does (daphne, the in-process Celery worker, the
in-memory channel layer), and drives it with streaming chat completions from a separate process (browsers and
API clients are other processes; in this one they would take the interpreter from the server being measured).
Each request's way to its first token is timed at the points below, by wrapping the functions that pass them
(nothing in the product records them): all on `time.perf_counter`, which on Linux is the system-wide monotonic
clock, so the client's times and the server's line up.

    sent          the client opens the connection and writes the request
    http          daphne hands the request to Django (the ASGI application is called)
    view          the API view starts (Django's request signal and middleware are behind)
    admitted      the user's concurrency slot is taken (authentication, parsing, limits)
    queued        the Celery task is sent (dispatch.submit_many returned)
    task          a worker thread starts the task (the Celery hop)
    arrival       the engine request exists (tokenised and checked: the engine's own clock starts)
    scheduled     its first prefill chunk is scheduled (queueing in the engine)
    first_token   its first token is sampled (the engine's time to first token ends)
    published     the token publisher sends its first text to the channel layer
    received      the web side's request lifecycle receives it
    written       the first event with text leaves the view for daphne
    delivered     the client reads the first text

    python -m bench.request_timeline --requests 96 --concurrency 32 --out bench/results/raw/timeline.json --label after
"""
from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

LOAD_TIMEOUT_S = 600
PHASES = ("sent", "http", "view", "admitted", "queued", "task", "arrival", "scheduled", "first_token", "published",
          "received", "written", "delivered")
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon "
         "phi chi psi omega").split()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.request_timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--prompt-words", type=int, default=250, help="random words a prompt (about 290 tokens)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--port", type=int, default=8812)
    p.add_argument("--out", type=Path, metavar="JSON", help="every request's timeline and the phase summary, under "
                   "runs.<label>; other labels already in the file are kept (two builds side by side in one record)")
    p.add_argument("--label", default="run", help="this run's name in --out (e.g. the commit)")
    args = p.parse_args(argv)
    if min(args.requests, args.concurrency, args.prompt_words, args.max_tokens) < 1:
        p.error("--requests, --concurrency, --prompt-words and --max-tokens must be at least 1")
    return args


class Timeline:
    """First time each request passed each phase (server side), keyed by the engine's request id."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {}
        self.entered: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("entered", default=None)

    def mark(self, request_id: str, phase: str, at: float | None = None) -> None:
        self.marks.setdefault(request_id, {}).setdefault(phase, time.perf_counter() if at is None else at)

    def install(self) -> None:
        """Wrap the functions each request passes (after django.setup(), before the server starts)."""
        import playground.asgi
        from playground.api import views
        from playground.serving.web import dispatch, lifecycle
        from playground.serving.worker import coalesce, engine_service, runtime

        application = playground.asgi.application

        async def asgi(scope, receive, send):
            if scope["type"] == "http":
                self.entered.set({"http": time.perf_counter()})
            return await application(scope, receive, send)

        playground.asgi.application = asgi
        complete = views._complete

        async def view(request, endpoint):
            entered = self.entered.get()
            if entered is not None:
                entered["view"] = time.perf_counter()
            return await complete(request, endpoint)

        views._complete = view
        generation_init = lifecycle.Generation.__init__

        def admitted(generation, slot):
            generation_init(generation, slot)
            for phase, at in (self.entered.get() or {}).items():
                self.mark(generation.request_id, phase, at)
            self.mark(generation.request_id, "admitted")

        lifecycle.Generation.__init__ = admitted
        submit_many = dispatch.submit_many

        def queued(jobs):
            queues = submit_many(jobs)
            for request_id, _ in jobs:
                self.mark(request_id, "queued")
            return queues

        dispatch.submit_many = queued
        serve = runtime.WorkerRuntime.serve

        def task(worker, request_id, job):
            self.mark(request_id, "task")
            return serve(worker, request_id, job)

        runtime.WorkerRuntime.serve = task
        result = engine_service.EngineService.result

        def engine_times(service, stream):
            metrics = stream.final.metrics
            for phase, at in (("arrival", metrics.arrival_time), ("scheduled", metrics.first_scheduled_time),
                              ("first_token", metrics.first_token_time)):
                if at is not None:
                    self.mark(stream.request_id, phase, at)
            return result(service, stream)

        engine_service.EngineService.result = engine_times
        flush = coalesce.TokenPublisher._flush

        async def published(channel, requests, posted, send, now):
            for request in requests:
                if request.pending:
                    self.mark(request.request_id, "published")
            return await flush(channel, requests, posted, send, now)

        coalesce.TokenPublisher._flush = staticmethod(published)
        put = lifecycle.Collector.put

        def received(collector, event):
            if event.get("type") == "gen.tokens":
                self.mark(event["request_id"], "received")
            return put(collector, event)

        lifecycle.Collector.put = received
        stream = views._stream

        async def written(shape, batch, firsts):
            request_id = batch.generations[0].request_id
            async for event in stream(shape, batch, firsts):
                if "written" not in self.marks.get(request_id, {}) and first_text(event) is not None:
                    self.mark(request_id, "written")
                yield event

        views._stream = written


def prompt(number: int, words: int) -> str:
    rng = random.Random(number)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def first_text(event: bytes) -> str | None:
    """The chat completion id of a server-sent event that carries text, None for any other event."""
    data = event.decode().removeprefix("data: ").strip()
    if not data.startswith("{"):
        return None
    chunk = json.loads(data)
    if any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", [])):
        return chunk["id"].removeprefix("chatcmpl-")
    return None


async def _one(port: int, body: dict[str, Any]) -> tuple[str, float, float]:
    """(request id, sent, first text read) of one streamed chat completion (HTTP/1.1, chunked events)."""
    payload = json.dumps(body).encode()
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"request failed: {status!r} {await reader.read(500)!r}")
    while await reader.readline() not in (b"\r\n", b""):  # headers
        pass
    pending, found = b"", None
    while size := int((await reader.readline()).strip() or b"0", 16):  # chunked transfer encoding
        pending += await reader.readexactly(size)
        await reader.readexactly(2)
        while found is None and b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if (request_id := first_text(event)) is not None:
                found = (request_id, sent, time.perf_counter())
    writer.close()
    if found is None:
        raise RuntimeError("the stream ended without text")
    return found


def drive(port: int, bodies: list[dict[str, Any]], concurrency: int) -> list[tuple[str, float, float]]:
    """Every request, `concurrency` at a time (in the client process)."""
    async def everyone():
        gate = asyncio.Semaphore(concurrency)

        async def one(body):
            async with gate:
                return await _one(port, body)

        return await asyncio.gather(*(one(body) for body in bodies))

    return asyncio.run(everyone())


def summary(timelines: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Per consecutive pair of phases: mean, median and p90 ms over the requests that passed both."""
    rows = []
    for start, end in zip(PHASES, PHASES[1:]):
        spans = [1000 * (t[end] - t[start]) for t in timelines if start in t and end in t]
        if spans:
            rows.append({"from": start, "to": end, "requests": len(spans), "mean_ms": statistics.mean(spans),
                         "median_ms": statistics.median(spans),
                         "p90_ms": statistics.quantiles(spans, n=10)[-1] if len(spans) > 1 else spans[0]})
    return rows


def outside_engine_ms(timelines: list[dict[str, float]]) -> dict[str, float]:
    """Client TTFT, the engine's own TTFT, and their difference (the path around the engine), means in ms."""
    whole = [t["delivered"] - t["sent"] for t in timelines]
    engine = [t["first_token"] - t["arrival"] for t in timelines]
    return {"client_ttft_ms": 1000 * statistics.mean(whole), "engine_ttft_ms": 1000 * statistics.mean(engine),
            "outside_engine_ms": 1000 * (statistics.mean(whole) - statistics.mean(engine)),
            "client_median_ttft_ms": 1000 * statistics.median(whole)}


def table(rows: list[dict[str, Any]], outside: dict[str, float]) -> str:
    lines = ["| phase | mean ms | median ms | p90 ms |", "|---|---|---|---|"]
    lines += [f"| {r['from']} → {r['to']} | {r['mean_ms']:.1f} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} |"
              for r in rows]
    lines.append(f"\nclient TTFT mean {outside['client_ttft_ms']:.0f} ms (median {outside['client_median_ttft_ms']:.0f}),"
                 f" engine TTFT mean {outside['engine_ttft_ms']:.0f} ms: {outside['outside_engine_ms']:.0f} ms a "
                 "request outside the engine")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from bench.__main__ import machine
    from playground.serving import embedded
    from playground.serving.worker import runtime

    call_command("migrate", interactive=False, verbosity=0)
    settings.PLAYGROUND_ANONYMOUS_LIMITS = {key: 0 for key in settings.PLAYGROUND_ANONYMOUS_LIMITS}  # one client
    timeline = Timeline()
    timeline.install()
    model = settings.PLAYGROUND_ENGINE["model"]
    bodies = [{"model": model, "messages": [{"role": "user", "content": prompt(i, args.prompt_words)}],
               "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
              for i in range(args.requests)]
    outcome: dict[str, Any] = {}

    def measure() -> None:
        try:
            runtime.current().service.wait_ready(LOAD_TIMEOUT_S)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                pool.submit(drive, args.port, bodies[:4], 4).result()  # warm-up, not counted
                timeline.marks.clear()
                client = pool.submit(drive, args.port, bodies, args.concurrency).result()
            timelines = []
            for request_id, sent, delivered in client:
                marks = dict(timeline.marks.get(request_id, {}), sent=sent, delivered=delivered)
                missing = [phase for phase in PHASES if phase not in marks]
                if missing:
                    raise RuntimeError(f"request {request_id} has no {', '.join(missing)} mark")
                timelines.append(marks)
            phases = summary(timelines)
            outcome["record"] = {"machine": machine(), "config": {k: str(v) if isinstance(v, Path) else v
                                                                  for k, v in vars(args).items()},
                                 "phases": phases, **outside_engine_ms(timelines),
                                 "mean_ms": {f"{r['from']}-{r['to']}": r["mean_ms"] for r in phases},
                                 "requests": timelines}
        except Exception as exc:
            outcome["error"] = exc
        finally:
            embedded.stop_serving()

    embedded.serve("127.0.0.1", args.port, lambda: threading.Thread(target=measure, daemon=True).start())
    if "record" not in outcome:
        print(f"benchmark failed: {outcome.get('error')!r}", file=sys.stderr)
        return 1
    record = outcome["record"]
    print(table(record["phases"], {k: record[k] for k in ("client_ttft_ms", "engine_ttft_ms", "outside_engine_ms",
                                                         "client_median_ttft_ms")}))
    if args.out is not None:
        kept = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
        kept["runs"][args.label] = record
        args.out.write_text(json.dumps(kept, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
