"""Websocket streaming benchmark on the embedded stack: does the web path keep up with the engine?

Two runs of one greedy workload (N chats at once) on the same in-process engine:
  bare: the engine's streams read directly, no Celery, no channel layer, no websocket;
  web:  N websocket clients through the consumer, Celery task, coalescing and the channel layer.
The web run's clients are asyncio clients in a separate process, as browsers would be: in the server's
process they would take its GIL from the engine and the web path being measured.
Reported: tokens/s of each, their ratio, and the delay from the engine emitting a token to a client
receiving it (the engine's per-token times come from the finished requests, text offsets from the
tokenizer; both processes read `perf_counter`, which on Linux is the system-wide CLOCK_MONOTONIC).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import connect

from ..worker.engine_service import EngineService

TOPICS = (
    "the sea", "a lighthouse", "autumn leaves", "a lost key", "mountains", "a city at night", "rain", "a robot",
    "coffee", "the moon", "a library", "trains", "winter", "a garden", "the desert", "a violin",
)  # fmt: skip


def workload(clients: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]}. ({i})"}]
            for i in range(clients)]  # fmt: skip


@dataclass
class Run:
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def run_bare(service: EngineService, chats: list[list[dict]], params: dict[str, Any]) -> Run:
    """All chats at once straight into the engine; each stream drained by its own thread."""
    counts: list[int] = []

    def drain(chat: list[dict]) -> None:
        stream = service.submit(uuid.uuid4().hex, chat, params)
        while stream.get() is not None:
            pass
        counts.append(sum(len(o.token_ids) for o in stream.final.outputs))

    threads = [threading.Thread(target=drain, args=(chat,)) for chat in chats]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Run(sum(counts), time.perf_counter() - start)


class FinalsRecorder:
    """Keeps each finished request's engine output (token ids and per-token times) as the worker ends it."""

    def __init__(self, service: EngineService) -> None:
        self.finals: dict[str, Any] = {}
        original = service.result

        def result(stream):
            self.finals[stream.request_id] = stream.final
            return original(stream)

        service.result = result


async def _client(ws_url: str, origin: str, chat: list[dict], params: dict) -> tuple[str, list[tuple[float, int]], int]:
    """One websocket client: returns its request id, (receive time, text length so far) per token frame,
    and the completion tokens of its `done`."""
    async with connect(ws_url, origin=origin, proxy=None, open_timeout=60, max_queue=None) as ws:
        await ws.send(json.dumps({"type": "generate", "messages": chat, "params": params}))
        received: list[tuple[float, int]] = []
        length = 0
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == "token":
                length += len(frame["text"])
                received.append((time.perf_counter(), length))
            elif frame["type"] == "done":
                return frame["request_id"], received, frame["usage"]["completion_tokens"]
            elif frame["type"] == "error":
                raise RuntimeError(f"generation failed: {frame['message']}")


def _clients(ws_url: str, origin: str, chats: list[list[dict]], params: dict) -> tuple[float, list[tuple]]:
    """Every chat's client at once (in the clients' process); returns the seconds until the last `done`."""

    async def everyone():
        return await asyncio.gather(*(_client(ws_url, origin, chat, params) for chat in chats))

    start = time.perf_counter()
    results = asyncio.run(everyone())
    return time.perf_counter() - start, results


def run_web(ws_url: str, origin: str, chats: list[list[dict]], params: dict) -> tuple[Run, list[tuple]]:
    """The web run, its clients in a fresh process (spawned: forking this one, with the engine's and the
    server's threads, could copy a lock some thread holds)."""
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        raise RuntimeError("perf_counter is not the system-wide monotonic clock here: delays would be meaningless")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as clients:
        seconds, results = clients.submit(_clients, ws_url, origin, chats, params).result()
    return Run(sum(r[2] for r in results), seconds), results


def delivery_delays(results: list[tuple], finals: dict[str, Any], tokenizer) -> list[float]:
    """Seconds from each token's engine time to the arrival of the frame completing its text."""
    delays = []
    for request_id, received, _ in results:
        output = finals[request_id].outputs[0]
        times = finals[request_id].metrics.token_times
        previous = 0
        for k, emitted_at in enumerate(times):
            end = len(tokenizer.decode(output.token_ids[: k + 1], skip_special_tokens=True))
            if end <= previous:  # a token with no text of its own (EOS, a partial character)
                continue
            previous = end
            arrival = next((t for t, length in received if length >= end), None)
            if arrival is not None:
                delays.append(arrival - emitted_at)
    return delays


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def report(clients: int, max_tokens: int, bare: Run, web: Run, delays: list[float], coalesce_ms: int) -> str:
    ratio = web.tokens_per_s / bare.tokens_per_s
    return "\n".join([
        "| clients | max_tokens | bare engine tok/s | delivered over websockets tok/s | ratio | delay p50 | delay p99 | coalesce |",
        "|---|---|---|---|---|---|---|---|",
        f"| {clients} | {max_tokens} | {bare.tokens_per_s:.1f} ({bare.tokens} tok / {bare.seconds:.1f} s) "
        f"| {web.tokens_per_s:.1f} ({web.tokens} tok / {web.seconds:.1f} s) | {ratio:.1%} "
        f"| {percentile(delays, 50) * 1000:.1f} ms | {percentile(delays, 99) * 1000:.1f} ms | {coalesce_ms} ms |",
    ])  # fmt: skip
