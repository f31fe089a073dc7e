"""Websocket streaming benchmark: does the web path keep up with the engine?

Two runs of one greedy workload (N chats at once), with the same engine settings:
  bare: an engine's streams read directly, no Celery, no channel layer, no websocket;
  web:  N websocket clients through the consumer, Celery task, coalescing and the channel layer (on the embedded
        stack the same engine as bare; on the distributed one, the worker process's).
The web run's clients are asyncio clients in a separate process, as browsers would be: in the server's
process they would take its GIL from the engine and the web path being measured. Each websocket client loads
the chat page and opens its socket before the clock starts, as a browser does before its user sends.
Reported: tokens/s of each, their ratio, and the delay from the engine emitting a token to a client
receiving it (the engine's per-token times come from the finished requests, text offsets from the
tokenizer; both processes read `perf_counter`, which on Linux is the system-wide CLOCK_MONOTONIC).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import statistics
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench import procfs
from playground.serving.shared.envelope import Job
from playground.serving.worker.engine_service import EngineService

TOPICS = (
    "the sea", "a lighthouse", "autumn leaves", "a lost key", "mountains", "a city at night", "rain", "a robot",
    "coffee", "the moon", "a library", "trains", "winter", "a garden", "the desert", "a violin",
)


def workload(clients: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]}. ({i})"}]
            for i in range(clients)]


@dataclass
class Run:
    tokens: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # see `phases`
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds between the run's start and end, by process
    texts: list[str] = field(default_factory=list)  # each chat's text, in the workload's order

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def run_bare(service: EngineService, chats: list[list[dict]], params: dict[str, Any]) -> Run:
    """All chats at once straight into the engine; each stream drained by its own thread."""
    finals: list[Any] = [None] * len(chats)

    def drain(number: int, chat: list[dict]) -> None:
        stream = service.submit(uuid.uuid4().hex, Job(params, chat))
        while stream.get() is not None:
            pass
        finals[number] = stream.final

    threads = [threading.Thread(target=drain, args=item) for item in enumerate(chats)]
    cpu_start, start = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end, cpu_end = time.perf_counter(), time.process_time()
    return Run(sum(len(o.token_ids) for f in finals for o in f.outputs), end - start, phases(start, end, finals),
               {"server": cpu_end - cpu_start}, [f.outputs[0].text for f in finals])


def phases(start: float, end: float, finals: list[Any]) -> dict[str, float]:
    """Where a run's seconds went, from the engine's own request times: until the first request reached the
    engine, until the last one did, until the engine's last token, and until the last client was done."""
    arrivals = sorted(f.metrics.arrival_time for f in finals)
    last_token = max(f.metrics.token_times[-1] for f in finals if f.metrics.token_times)
    return {"to_first_arrival_s": arrivals[0] - start, "arrival_spread_s": arrivals[-1] - arrivals[0],
            "engine_span_s": last_token - arrivals[0], "after_last_token_s": end - last_token}


class FinalsRecorder:
    """Keeps each finished request's engine output (token ids and per-token times) as the worker ends it."""

    def __init__(self, service: EngineService) -> None:
        self.finals: dict[str, Any] = {}
        original = service.result

        def result(stream):
            self.finals[stream.request_id] = stream.final
            return original(stream)

        service.result = result


@dataclass
class Delivery:
    """What one client received: (receive time, text length so far) per text frame or chunk, the text."""

    kind: str  # "ws" or "api"
    request_id: str
    received: list[tuple[float, int]]
    completion_tokens: int
    text: str


async def _open_chat(ws_url: str, page_url: str) -> ClientConnection:
    """As a browser opens the chat: load the page (which gives an anonymous visitor the session that owns their
    chats), then open the socket with its cookie."""
    host, _, port = page_url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
    head = (await reader.read()).partition(b"\r\n\r\n")[0].decode()
    writer.close()
    cookies = [line.split(":", 1)[1].split(";", 1)[0].strip() for line in head.splitlines()
               if line.lower().startswith("set-cookie:")]
    if not any(cookie.startswith("sessionid=") for cookie in cookies):
        raise RuntimeError(f"the chat page set no session: {head.splitlines()[:1]}")
    return await connect(ws_url, origin=page_url, proxy=None, open_timeout=60, max_queue=None,
                         additional_headers={"Cookie": "; ".join(cookies)})


async def _ws_client(ws: ClientConnection, chat: list[dict], params: dict) -> Delivery:
    """One websocket chat on an open socket, through the consumer, until its reply is done (the socket stays
    open: the chat page keeps it for the next turn)."""
    await ws.send(json.dumps({"type": "generate", "messages": chat, "params": params}))
    received: list[tuple[float, int]] = []
    text = ""
    while True:
        frame = json.loads(await ws.recv())
        if frame["type"] == "token":
            text += frame["text"]
            received.append((time.perf_counter(), len(text)))
        elif frame["type"] == "done":
            return Delivery("ws", frame["request_id"], received, frame["usage"]["completion_tokens"], text)
        elif frame["type"] == "error":
            raise RuntimeError(f"generation failed: {frame['message']}")


async def _api_client(api_url: str, api_key: str, model: str, chat: list[dict], params: dict) -> Delivery:
    """One streaming client of POST /v1/chat/completions (server-sent events over HTTP/1.1, chunked)."""
    host, _, port = api_url.removeprefix("http://").partition(":")
    body = json.dumps({"model": model, "messages": chat, "stream": True, "stream_options": {"include_usage": True},
                       **params}).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {api_key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                 + body)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"API request failed: {status!r} {await reader.read(500)!r}")
    while await reader.readline() not in (b"\r\n", b""):  # headers
        pass
    received: list[tuple[float, int]] = []
    text, request_id, completion_tokens, pending = "", "", 0, b""
    while size := int((await reader.readline()).strip() or b"0", 16):  # chunked transfer encoding
        pending += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            data = event.decode().removeprefix("data: ")
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"generation failed: {chunk['error']['message']}")
            request_id = chunk["id"].removeprefix("chatcmpl-")
            if chunk.get("usage"):
                completion_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    text += choice["delta"]["content"]
                    received.append((time.perf_counter(), len(text)))
    writer.close()
    return Delivery("api", request_id, received, completion_tokens, text)


@dataclass(frozen=True)
class Clients:
    """Who connects in the web run: websocket chats and, at the same time, streaming API chats."""

    ws_url: str
    origin: str
    ws_chats: list[list[dict]]
    api_url: str = ""
    api_key: str = ""
    model: str = ""
    api_chats: list[list[dict]] = field(default_factory=list)
    # The processes whose CPU a web run reports, by name; unset: the server is the benchmark's own process.
    cpu_pids: dict[str, int] = field(default_factory=dict)


def _clients(clients: Clients, params: dict) -> tuple[float, float, dict[str, float], list[Delivery]]:
    """Every client at once (in the clients' process); returns when they started, when the last one was done,
    the CPU seconds the server's processes (`clients.cpu_pids`, or this process's parent) and the clients used in
    between, and what each received, in the order of the chats (websocket, then API). The websocket chats' pages
    are loaded and their sockets open before the clock starts, as a browser's are before its user sends, and
    closed after it stops, as the page keeps its socket between turns (closing 64 inside the clock had added
    ~0.15 s to a ~10 s run); an API client connects per request, as API clients do."""
    watched = {**(clients.cpu_pids or {"server": os.getppid()}), "clients": os.getpid()}

    async def everyone():
        sockets = await asyncio.gather(*(_open_chat(clients.ws_url, clients.origin) for _ in clients.ws_chats))
        cpu_start = {name: procfs.cpu_seconds(pid) for name, pid in watched.items()}
        start = time.perf_counter()
        try:
            results = await asyncio.gather(
                *(_ws_client(ws, chat, params) for ws, chat in zip(sockets, clients.ws_chats)),
                *(_api_client(clients.api_url, clients.api_key, clients.model, chat, params)
                  for chat in clients.api_chats),
            )
            end = time.perf_counter()
            cpu = {name: procfs.cpu_seconds(pid) - cpu_start[name] for name, pid in watched.items()}
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))
        return start, end, cpu, results

    return asyncio.run(everyone())


def run_web(clients: Clients, params: dict, finals: dict[str, Any] | None) -> tuple[Run, list[Delivery]]:
    """The web run, its clients in a fresh process (spawned: forking this one, with the engine's and the
    server's threads, could copy a lock some thread holds); `finals`: the engine's outputs by request id
    (FinalsRecorder's), for the run's phases; None where the engine is another process's (no phases)."""
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        raise RuntimeError("perf_counter is not the system-wide monotonic clock here: delays would be meaningless")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        start, end, cpu, results = pool.submit(_clients, clients, params).result()
    split = phases(start, end, [finals[r.request_id] for r in results]) if finals is not None else {}
    return Run(sum(r.completion_tokens for r in results), end - start, split, cpu, [r.text for r in results]), results


def texts_unlike_bare(bare: Run, web: Run) -> list[int]:
    """The chats (by number in the workload) whose delivered text differs from the bare engine's (greedy: the
    same prompt gives the same text), for a stack whose engine's own outputs this process cannot see."""
    return [number for number, (engine, delivered) in enumerate(zip(bare.texts, web.texts, strict=True))
            if engine != delivered]


def delivery_delays(results: list[Delivery], finals: dict[str, Any], tokenizer) -> list[float]:
    """Seconds from each token's engine time to the arrival of the frame completing its text."""
    delays = []
    for result in results:
        output = finals[result.request_id].outputs[0]
        times = finals[result.request_id].metrics.token_times
        previous = 0
        for k, emitted_at in enumerate(times):
            end = len(tokenizer.decode(output.token_ids[: k + 1], skip_special_tokens=True))
            if end <= previous:  # a token with no text of its own (EOS, a partial character)
                continue
            previous = end
            arrival = next((t for t, length in result.received if length >= end), None)
            if arrival is not None:
                delays.append(arrival - emitted_at)
    return delays


def mismatched_texts(results: list[Delivery], finals: dict[str, Any]) -> list[str]:
    """Request ids whose delivered text differs from the engine's final text."""
    return [r.request_id for r in results if r.text != finals[r.request_id].outputs[0].text]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def report(ws_clients: int, api_clients: int, max_tokens: int, bare: Run, web: Run,
           delays: dict[str, list[float]], coalesce_ms: int) -> str:
    """A markdown table row: throughput of both runs, and the engine-to-client delay per kind of client."""
    ratio = web.tokens_per_s / bare.tokens_per_s
    every = [d for kind in delays.values() for d in kind]

    def p(values: list[float], q: int) -> str:
        return f"{percentile(values, q) * 1000:.1f} ms" if values else "-"

    return "\n".join([
        "| websocket clients | API clients | max_tokens | bare engine tok/s | delivered tok/s | ratio "
        "| websocket delay p50 / p99 | API delay p50 / p99 | all p99 | coalesce |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {ws_clients} | {api_clients} | {max_tokens} | {bare.tokens_per_s:.1f} ({bare.tokens} tok / {bare.seconds:.1f} s) "
        f"| {web.tokens_per_s:.1f} ({web.tokens} tok / {web.seconds:.1f} s) | {ratio:.1%} "
        f"| {p(delays.get('ws', []), 50)} / {p(delays.get('ws', []), 99)} "
        f"| {p(delays.get('api', []), 50)} / {p(delays.get('api', []), 99)} | {p(every, 99)} | {coalesce_ms} ms |",
        "",
        *(f"{name}: {_split(run)}" for name, run in (("bare", bare), ("web", web)) if run.phases or run.cpu),
    ])


def _split(run: Run) -> str:
    """A run's phases and CPU seconds by process, whichever it has, on one line."""
    parts = []
    if run.phases:
        parts.append("phases " + ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in run.phases.items()))
    if run.cpu:
        parts.append("CPU " + ", ".join(f"{k} {v:.2f} s" for k, v in run.cpu.items()))
    return "; ".join(parts)


def round_record(order: tuple[str, ...], bare: Run, web: Run, delays: dict[str, list[float]]) -> dict[str, Any]:
    """One round's figures as JSON, for a bench/results record's paths (`rounds.*.web.tokens_per_s`...)."""
    def ms(values: list[float], q: int) -> float | None:
        return round(percentile(values, q) * 1000, 1) if values else None

    return {"order": list(order),
            "bare": {"tokens": bare.tokens, "seconds": round(bare.seconds, 3), "tokens_per_s": bare.tokens_per_s,
                     **{k: round(v, 3) for k, v in bare.phases.items()},
                     **{f"{k}_cpu_s": round(v, 2) for k, v in bare.cpu.items()}},
            "web": {"tokens": web.tokens, "seconds": round(web.seconds, 3), "tokens_per_s": web.tokens_per_s,
                    **{k: round(v, 3) for k, v in web.phases.items()},
                    **{f"{k}_cpu_s": round(v, 2) for k, v in web.cpu.items()},
                    **{f"{kind}_delay_p{q}_ms": ms(delays.get(kind, []), q) for kind in ("ws", "api") for q in (50, 99)}},
            "ratio": web.tokens_per_s / bare.tokens_per_s}
