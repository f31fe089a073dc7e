"""StreamingEngine: one engine loop thread serving many concurrent callers (the shape a worker hosts).

Callers in any thread (or asyncio loop) call `add_request`, which validates and tokenises the request in
the caller's thread — a bad request raises `ValueError` there and never reaches the loop — and returns
a `RequestStream`. The loop thread owns the `LLMEngine`: it drains queued commands (add, abort), runs
`step()` while there is work, and pushes each output's new text into that request's stream. Iterating a
stream (plainly or with `async for`) yields `StreamDelta`s until every output has finished;
`stream.final` then holds the complete `RequestOutput`.

No stream waits forever. If a step raises, every in-flight stream ends with finish_reason "error" and the
loop keeps serving. If anything else in the loop raises, the loop is dead: every in-flight stream (and any
request still queued) ends with an error, their blocks are freed, `health()` reports the error, and
`add_request` raises `EngineDeadError`. A tensor-parallel rank that dies (`RankFailedError`, raised by the
step it breaks or noticed between steps) kills the loop the same way: the engine cannot step again.
`shutdown()` ends the in-flight streams the same way, and stops the rank processes.

Work that must not slow the live requests (a lab sandbox's step) goes through `call_in_background`: the
loop runs it when idle, and while busy only as long as background work has taken at most
BACKGROUND_SHARE of the loop's time — on the loop's own thread, so it never competes for the cores.

    engine = StreamingEngine(model="smollm2-135m-instruct")
    engine.start()
    stream = engine.add_request("Hello", SamplingParams(max_tokens=32))
    for delta in stream:
        print(delta.text, end="")
    engine.abort(stream.request_id)   # from any thread; frees the blocks at the next loop turn
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from inference.block_manager import IntegrityError
from inference.config import EngineArgs
from inference.detokenizer import Detokenizer
from inference.engine import LLMEngine
from inference.input_processor import encode_text, load_tokenizer
from inference.llm import encode_chat
from inference.lora import LoRARequest
from inference.model_loader import resolve_model
from inference.openmp import on_own_thread
from inference.outputs import RequestOutput, StreamDelta
from inference.parallel.ranks import RankFailedError
from inference.sampling_params import SamplingParams
from inference.sequence import Request

T = TypeVar("T")

logger = logging.getLogger(__name__)
_END = object()


class RequestStream:
    """Deltas of one request, filled by the loop thread, read by one consumer (sync or async)."""

    def __init__(self, request_id: str, num_prompt_tokens: int) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.final: RequestOutput | None = None
        self.error: str | None = None
        # Output indices whose finishing delta was sent (touched by the loop thread only).
        self.closed_indices: set[int] = set()
        # Set by the reader before it reads, to be woken instead of polling: called on the loop thread after
        # a delta is queued, so it must be cheap (e.g. schedule a wake-up on the reader's event loop). After a
        # step, once all its deltas are queued, and once per distinct callback: many streams may share one
        # reader, and waking it per stream made it drain them while the loop was still filling them.
        self.on_put: Callable[[], None] | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def _put(self, item: object, woken: set[Callable[[], None]] | None = None) -> None:
        """Queue `item` and wake the reader, or, given `woken`, add its callback there for the caller to call."""
        self._queue.put(item)
        if self.on_put is not None:
            if woken is None:
                self.on_put()
            else:
                woken.add(self.on_put)

    def get(self, timeout: float | None = None) -> StreamDelta | None:
        """Next delta, or None at the end of the stream; raises queue.Empty on timeout."""
        item = self._queue.get(timeout=timeout)
        if item is _END:
            self._queue.put(_END)  # keep the end visible to later calls
            return None
        return item

    def __iter__(self) -> Iterator[StreamDelta]:
        while (delta := self.get()) is not None:
            yield delta

    async def __aiter__(self) -> AsyncIterator[StreamDelta]:
        while (delta := await asyncio.to_thread(self.get)) is not None:
            yield delta


@dataclass(frozen=True)
class EngineHealth:
    """What a heartbeat reports about the engine loop.

    alive: the loop thread runs and accepts requests. error: why the loop died (None while alive, or
    after a clean shutdown). last_step_at: Unix time (time.time()) of the last finished step, None before
    the first.
    """

    alive: bool
    error: str | None
    last_step_at: float | None


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (it failed, or was shut down) and accepts no more requests."""


class StreamingEngine:
    # The block map in metrics() is rebuilt at most this often while busy (dashboards poll a few times a second).
    BLOCK_MAP_INTERVAL_S = 0.1
    # While live requests run, background calls get at most this share of the loop's time (issue 17: a lab
    # beside a live batch may slow it by 5% at most); credit saved while busy is capped at BACKGROUND_BURST_S.
    BACKGROUND_SHARE = 0.03
    BACKGROUND_BURST_S = 0.2

    def __init__(self, **kwargs) -> None:
        self.args = EngineArgs(**kwargs)
        self.engine = on_own_thread(LLMEngine, self.args)  # the caller keeps no OpenMP team (openmp.py)
        # A second tokenizer for callers' threads: the loop thread's one is never shared.
        self.tokenizer = load_tokenizer(resolve_model(self.args.model))
        self._tokenizer_lock = threading.Lock()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._background: queue.SimpleQueue = queue.SimpleQueue()
        self._background_credit_s = 0.0  # loop-thread only: background time earned by live steps, not yet spent
        self._wakeup = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._metrics: dict = self.engine.metrics()
        self._block_map_time = time.monotonic()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Set once, under _lock, when the loop stops: why new requests are refused. Commands are queued
        # under the same lock, so each one is either drained by the loop or refused, never stranded.
        self._lock = threading.Lock()
        self._closed: str | None = None
        self._error: str | None = None
        self._last_step_at: float | None = None

    # --- caller side (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.engine.close()

    def add_request(
        self,
        prompt: str | list[int] | None,
        sampling_params: SamplingParams,
        request_id: str | None = None,
        messages: list[dict] | None = None,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
        chat_options: dict | None = None,
    ) -> RequestStream:
        """Queue a request; raises ValueError (and changes nothing) if it is invalid.

        A `lora_request`'s adapter is loaded (and checked) here, in the caller's thread. `chat_options` are
        `encode_chat`'s keyword arguments for `messages` (add_generation_prompt, template variables...).
        """
        request_id = request_id or uuid.uuid4().hex
        with self._tokenizer_lock:
            if messages is not None:
                ids = encode_chat(self.tokenizer, messages, **(chat_options or {}))
                prompt = {"prompt_token_ids": ids, "prompt": None}
            elif isinstance(prompt, list):
                prompt = {"prompt_token_ids": prompt}
            elif isinstance(prompt, str):
                prompt = {"prompt": prompt, "prompt_token_ids": encode_text(self.tokenizer, prompt)}
            else:
                raise ValueError("give a prompt (text or token ids) or messages")
        request = self.engine.make_request(request_id, prompt, sampling_params, cache_salt=cache_salt,
                                           lora_request=lora_request)
        stream = RequestStream(request_id, len(request.prompt_token_ids))
        self._submit(self._commands, ("add", request, stream))
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id, None))
        self._wakeup.set()

    def reset_prefix_cache(self) -> None:
        self._commands.put(("reset", None, None))
        self._wakeup.set()

    def call(self, fn: Callable[[LLMEngine], T]) -> Future[T]:
        """Run `fn(engine)` on the loop thread between steps (the only thread that may touch the engine);
        the future holds its result or its exception."""
        future: Future[T] = Future()
        self._submit(self._commands, ("call", fn, future))
        return future

    def call_in_background(self, fn: Callable[[LLMEngine], T]) -> Future[T]:
        """Like `call`, for work that must not slow the live requests: `fn` runs on the loop thread when no
        request is running, or between steps once background calls have used less than BACKGROUND_SHARE of
        the loop's busy time. Calls run one at a time, in order."""
        future: Future[T] = Future()
        self._submit(self._background, (fn, future))
        return future

    def _submit(self, commands: queue.SimpleQueue, item: tuple) -> None:
        """Queue `item` for the loop, or raise EngineDeadError once it has stopped. Under `_lock`, which
        `_close` takes too, so every item is either drained by the loop or refused, never stranded."""
        with self._lock:
            if self._closed is not None:
                raise EngineDeadError(self._closed)
            commands.put(item)
        self._wakeup.set()

    def health(self) -> EngineHealth:
        thread = self._thread
        alive = thread is not None and thread.is_alive() and self._closed is None
        return EngineHealth(alive, self._error, self._last_step_at)

    def metrics(self) -> dict:
        """The latest figures, refreshed by the loop after every step (a consistent snapshot)."""
        return self._metrics

    def encode_chat(self, messages: list[dict], **chat_options: object) -> list[int]:
        with self._tokenizer_lock:
            return encode_chat(self.tokenizer, messages, **chat_options)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """A plain prompt's token ids, as `add_request` tokenises it (with `add_special_tokens`, as the
        tokenizer adds them: vLLM's /tokenize default)."""
        with self._tokenizer_lock:
            return encode_text(self.tokenizer, text, add_special_tokens)

    # --- loop thread ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except Exception as exc:
            logger.exception("engine loop died")
            self._error = f"engine loop failed: {type(exc).__name__}: {exc}"
        finally:
            self._close(self._error or "the engine has shut down")

    def _serve(self) -> None:
        checked_since_busy = True
        while not self._stopping:
            self.engine.check_alive()
            self._drain_commands()
            if not self.engine.has_unfinished_requests():
                if not checked_since_busy:
                    # Idle: assert the block-accounting invariants once, and publish exact figures.
                    self._check_integrity()
                    self._refresh_metrics(force=True)
                    checked_since_busy = True
                if self._run_background(idle=True):
                    continue  # look for live work before the next background call
                self._wakeup.wait(timeout=0.5)
                self._wakeup.clear()
                continue
            checked_since_busy = False
            began = time.perf_counter()
            try:
                outputs = self.engine.step()
            except RankFailedError:
                raise  # the ranks are gone: the loop dies with it
            except Exception as exc:  # keep serving: fail the in-flight requests, not the worker
                logger.exception("engine step failed")
                self._fail_all(f"engine step failed: {exc}")
                continue
            self._last_step_at = time.time()
            woken: set[Callable[[], None]] = set()
            for output in outputs:
                self._publish(output, woken)
            for wake in woken:
                wake()
            self._refresh_metrics()
            share = self.BACKGROUND_SHARE
            self._background_credit_s = min(self.BACKGROUND_BURST_S, self._background_credit_s
                                            + (time.perf_counter() - began) * share / (1 - share))
            self._run_background(idle=False)

    def _run_background(self, idle: bool) -> bool:
        """Run the next background call if the loop is idle or has credit for it; True if one ran. Its
        duration is paid from the credit while busy (so one long call is followed by a longer wait)."""
        if not idle and self._background_credit_s <= 0:
            return False
        try:
            fn, future = self._background.get_nowait()
        except queue.Empty:
            return False
        began = time.perf_counter()
        if future.set_running_or_notify_cancel():
            self._settle(future, fn)
        if not idle:
            self._background_credit_s -= time.perf_counter() - began
        return True

    def _refresh_metrics(self, force: bool = False) -> None:
        """Counters after every step; the per-block map (O(blocks)) at most every BLOCK_MAP_INTERVAL_S. Between
        rebuilds the last map goes on with its own step's block tables (`sequences`): a reader that found the map
        without them kept its older pair, so a dashboard sampling every 250 ms could miss a whole generation."""
        now = time.monotonic()
        if force or now - self._block_map_time >= self.BLOCK_MAP_INTERVAL_S:
            self._metrics = self.engine.metrics()
            self._block_map_time = now
        else:
            last = self._metrics
            self._metrics = {**self.engine.metrics(block_map=False), "block_map": last["block_map"],
                             "sequences": last["sequences"]}

    def _check_integrity(self) -> None:
        try:
            self.engine.check_integrity()
        except IntegrityError:  # a bug: say so loudly, but keep the worker serving
            logger.exception("KV cache invariant violated")

    def _drain_commands(self) -> None:
        changed = False
        while True:
            try:
                kind, payload, stream = self._commands.get_nowait()
            except queue.Empty:
                break
            changed = True
            if kind == "add":
                try:
                    self._add(payload, stream)
                except ValueError as exc:
                    stream.error = str(exc)
                    stream._put(_END)
            elif kind == "abort":
                output = self.engine.abort_request(payload)
                if output is not None:
                    self._publish(output)
            elif kind == "reset":
                self.engine.reset_prefix_cache()
            elif kind == "call":
                self._settle(stream, payload)
        if changed:
            self._refresh_metrics(force=True)

    def _settle(self, future: Future, fn: Callable[[LLMEngine], object]) -> None:
        """Run `fn(engine)` (loop thread) into `future`: its result, or the exception it raised."""
        try:
            future.set_result(fn(self.engine))
        except Exception as exc:
            future.set_exception(exc)

    def _add(self, request: Request, stream: RequestStream) -> None:
        """Hand a request to the engine; its stream is registered first, so that if `add` fails other than
        by refusing it (ValueError), the loop's failure ends this stream with the rest."""
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self._streams[request.request_id] = (stream, request)
        try:
            self.engine.add(request)
        except ValueError:
            del self._streams[request.request_id]
            raise

    def _publish(self, output: RequestOutput, woken: set[Callable[[], None]] | None = None) -> None:
        """Queue the output's new text on its stream; `woken` as RequestStream._put's."""
        entry = self._streams.get(output.request_id)
        if entry is None:
            return
        stream, request = entry
        for seq in sorted(request.seqs, key=lambda s: s.index):
            if seq.index in stream.closed_indices:
                continue
            text = Detokenizer.streamable_text(seq)
            new_ids = seq.output_token_ids[seq.num_emitted_tokens :]
            seq.num_emitted_tokens = seq.num_output_tokens
            if text or new_ids or seq.is_finished:
                stream._put(StreamDelta(output.request_id, seq.index, text, new_ids, seq.is_finished,
                                        seq.finish_reason), woken)
            if seq.is_finished:
                stream.closed_indices.add(seq.index)
        if output.finished:
            stream.final = output
            stream._put(_END, woken)
            del self._streams[output.request_id]

    def _fail_all(self, message: str) -> None:
        """End every in-flight stream with an error, then abort its request (freeing its blocks)."""
        streams, self._streams = self._streams, {}
        for stream, _ in streams.values():
            _end_with_error(stream, message)
        for request_id in streams:
            self.engine.abort_request(request_id)

    def _close(self, message: str) -> None:
        """The loop is stopping: refuse new requests, fail the queued and in-flight ones."""
        with self._lock:
            self._closed = message
        while True:
            try:
                kind, _, stream = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                _end_with_error(stream, message)
            elif kind == "call":
                stream.set_exception(EngineDeadError(message))
        while True:
            try:
                _, future = self._background.get_nowait()
            except queue.Empty:
                break
            future.set_exception(EngineDeadError(message))
        try:
            self._fail_all(message)
        except Exception:
            logger.exception("could not abort the failed requests")


def _end_with_error(stream: RequestStream, message: str) -> None:
    stream.error = message
    stream._put(StreamDelta(stream.request_id, 0, "", [], True, "error"))
    stream._put(_END)
