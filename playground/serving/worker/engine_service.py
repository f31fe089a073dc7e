"""The one place that talks to `inference.StreamingEngine`: load, submit, result, abort, metrics.

A GPU worker (Celery, or the embedded in-process one) owns one EngineService. `inference` (and so torch) is
imported only when the engine loads, so importing this module costs the web process nothing.
"""
from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..shared.envelope import Job

if TYPE_CHECKING:
    from inference import RequestOutput, RequestStream, StreamingEngine

from .context_window import fit_conversation

logger = logging.getLogger(__name__)


RECORDING_CALL_TIMEOUT_S = 30.0  # the engine loop runs the call between two steps


class EngineUnavailable(RuntimeError):
    """The engine failed to load or is shut down; requests cannot be served."""


class EngineService:
    def __init__(
        self, engine_kwargs: dict[str, Any], engine_factory: Callable[..., StreamingEngine] | None = None,
        lora_modules: dict[str, str] | None = None,
    ) -> None:
        """`engine_factory` builds the engine from the kwargs; `inference.StreamingEngine` unless given.
        `lora_modules`: adapter name -> PEFT folder (settings.PLAYGROUND_LORA_MODULES); a request names one."""
        self._kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
        self._lora_modules = dict(lora_modules or {})
        self._factory = engine_factory
        self._engine: StreamingEngine | None = None
        self._error: str | None = None
        self._loaded = threading.Event()
        # The context-window report of each fitted request, until its `done` (weak: a failed stream leaves none).
        self._fits: weakref.WeakKeyDictionary[RequestStream, dict[str, Any]] = weakref.WeakKeyDictionary()

    # --- lifecycle --------------------------------------------------------------------------------
    def load(self) -> None:
        """Build and start the engine (slow: loads the model). Run it off any thread Celery watches."""
        try:
            if self._factory is None:
                from inference import StreamingEngine

                self._factory = StreamingEngine
            engine = self._factory(**self._kwargs)
            engine.start()
            self._engine = engine
            logger.info("engine ready: %s", self._kwargs)
        except Exception as exc:
            logger.exception("engine failed to load")
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._loaded.set()

    @property
    def state(self) -> str:
        """'loading', 'ready' or 'failed' (the model did not load, the engine is shut down, or its loop
        thread died or failed: `health()` says why)."""
        if not self._loaded.is_set():
            return "loading"
        return "ready" if self.health()["alive"] else "failed"

    def health(self) -> dict[str, Any]:
        """The engine loop's health as the heartbeat carries it: {"alive", "error", "last_step_at"}."""
        engine = self._engine
        if engine is None:
            error = self._error or ("the model is still loading" if not self._loaded.is_set() else "engine shut down")
            return {"alive": False, "error": error, "last_step_at": None}
        health = engine.health()
        return {"alive": health.alive, "error": health.error, "last_step_at": health.last_step_at}

    @property
    def max_model_len(self) -> int | None:
        """The engine's longest sequence, resolved at load from the model and the KV pool (None until loaded):
        the heartbeat carries it so the web side states the window the workers really serve."""
        engine = self._engine
        return None if engine is None else engine.engine.max_model_len

    @property
    def suggested_sampling(self) -> dict[str, Any] | None:
        """The model's generation_config.json suggestions (SamplingParams field -> value; None until loaded):
        the heartbeat carries them so the API uses them for the fields a request leaves unset, as vLLM does."""
        engine = self._engine
        return None if engine is None else dict(engine.engine.generation.sampling)

    def wait_ready(self, timeout: float | None = None) -> StreamingEngine:
        """The engine once loaded and healthy; raises EngineUnavailable otherwise (after `timeout` s loading)."""
        if not self._loaded.wait(timeout):
            raise EngineUnavailable("the model is still loading")
        if self._engine is None:
            raise EngineUnavailable(f"the model failed to load: {self._error or 'engine shut down'}")
        health = self.health()
        if not health["alive"]:
            raise EngineUnavailable(f"the engine loop failed: {health['error']}")
        return self._engine

    def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()

    # --- requests ---------------------------------------------------------------------------------
    def submit(self, request_id: str, job: Job) -> RequestStream:
        """Queue one request envelope: a chat (`job.messages`, rendered with the job's chat-template options)
        or a plain completion (`job.prompt`, text or token ids), under the job's LoRA adapter; raises ValueError
        (nothing queued) when the engine refuses it (a bad or unknown adapter too), EngineUnavailable when it
        cannot serve. With `job.fit_window` (the chat page) the oldest turns that do not fit the context window
        are dropped (context_window.py) and reported in the `done` payload's `context`; without it a transcript
        too long is refused."""
        from inference import EngineDeadError, LoRARequest, SamplingParams

        engine = self.wait_ready(0)
        lora_request = None
        if job.adapter is not None:
            if job.adapter not in self._lora_modules:
                raise ValueError(f"unknown LoRA adapter {job.adapter!r}")
            # Ids follow PLAYGROUND_LORA_MODULES's order, so every worker gives a name the same id.
            lora_request = LoRARequest(job.adapter, list(self._lora_modules).index(job.adapter) + 1,
                                       self._lora_modules[job.adapter])
        chat_options = _chat_options(job)
        prompt, messages = job.prompt, job.messages
        fitted = None
        if job.fit_window and messages is not None:
            fitted = fit_conversation(messages, job.params.get("max_tokens") or 1, engine.engine.max_model_len,
                                      lambda turns: engine.encode_chat(turns, **chat_options))
            prompt, messages = fitted.prompt_ids, None  # rendered while fitting: the engine takes the ids
        if job.truncate_prompt_tokens is not None:  # vLLM's meaning: keep the prompt's last k tokens
            if messages is not None:
                prompt, messages = engine.encode_chat(messages, **chat_options), None
            elif isinstance(prompt, str):
                prompt = engine.encode(prompt)
            prompt = prompt[-job.truncate_prompt_tokens:]
        try:
            stream = engine.add_request(prompt, SamplingParams(**job.params), request_id=request_id, messages=messages,
                                        cache_salt=job.cache_salt, lora_request=lora_request,
                                        chat_options=chat_options)
        except EngineDeadError as exc:  # the loop died since wait_ready looked
            raise EngineUnavailable(f"the engine loop failed: {exc}") from exc
        if fitted is not None:
            self._fits[stream] = fitted.report()
        return stream

    def tokenize(self, job: Job) -> dict[str, Any]:
        """The answer to a "tokenize" or "detokenize" job (vLLM's /tokenize, /detokenize), computed here with the
        tokenizer and chat template a generation of the same job would use, without the engine's scheduler (no
        sequence, no KV block). Raises ValueError naming the field for input the tokenizer cannot take (an id
        outside the vocabulary, a transcript the template refuses)."""
        engine = self.wait_ready(0)
        tokenizer = engine.tokenizer
        if job.kind == "detokenize":
            vocab = len(tokenizer)
            unknown = next((t for t in job.prompt if not 0 <= t < vocab), None)
            if unknown is not None:
                raise ValueError(f"tokens: token id {unknown} is out of vocabulary (this model has {vocab} tokens)")
            return {"prompt": tokenizer.decode(job.prompt)}
        if job.messages is not None:
            ids = engine.encode_chat(job.messages, **_chat_options(job))
        else:
            ids = engine.encode(job.prompt, add_special_tokens=job.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.engine.max_model_len,
                "token_strs": tokenizer.convert_ids_to_tokens(ids) if job.return_token_strs else None}

    def result(self, stream: RequestStream) -> dict[str, Any]:
        """The `done` payload of a stream that has ended: outputs, usage and timing (docs/protocol.md).
        Raises EngineUnavailable if the engine failed the request."""
        if stream.error is not None or stream.final is None:
            raise EngineUnavailable(stream.error or "the request ended without a result")
        engine = self.wait_ready(0)
        done = summarize(stream.final, self._decode, engine.engine.block_size)
        context = self._fits.pop(stream, None)
        if context is not None:
            done["context"] = context
        return done

    def _decode(self, token_ids: list[int]) -> str:
        return self.wait_ready(0).tokenizer.decode(token_ids)

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe); its blocks are freed at the engine loop's next turn."""
        if self._engine is not None:
            self._engine.abort(request_id)

    def reset_prefix_cache(self) -> None:
        """Drop every cached, unreferenced block (thread-safe; done at the engine loop's next turn)."""
        if self._engine is not None:
            self._engine.reset_prefix_cache()

    def start_recording(self, limit: int) -> None:
        """Record the engine's events from now on (inference.events; a live replay starts from this pool)."""
        self.wait_ready(0).call(lambda engine: engine.start_recording(limit)).result(RECORDING_CALL_TIMEOUT_S)

    def stop_recording(self) -> dict[str, Any] | None:
        """The recording as JSON-ready data, or None when none was running."""
        recording = self.wait_ready(0).call(lambda engine: engine.stop_recording()).result(RECORDING_CALL_TIMEOUT_S)
        return None if recording is None else recording.to_dict()

    def metrics(self, block_map: bool = False) -> dict[str, Any]:
        """The engine's latest figures ({} while loading); the block map only when asked (it is large)."""
        if self._engine is None:
            return {}
        figures = self._engine.metrics()
        return figures if block_map else {k: v for k, v in figures.items() if k not in ("block_map", "sequences")}


def _chat_options(job: Job) -> dict[str, Any]:
    """`encode_chat`'s keyword arguments for the job's transcript: how the chat template renders it."""
    return {"add_generation_prompt": job.add_generation_prompt, "continue_final_message": job.continue_final_message,
            **job.chat_template_kwargs}


def summarize(
    final: RequestOutput, decode: Callable[[list[int]], str] | None = None, block_size: int | None = None
) -> dict[str, Any]:
    """Outputs, usage and timing of a finished request, as the `done` event carries them. Outputs that
    carry logprobs (the request asked for them) get them with token texts from `decode(token ids)`; outputs
    of a grammar-constrained request get `grammar_mask`: per generated token, how many of the vocabulary's
    tokens the mask removed. With the engine's `block_size`, the cache receipt too (inference/receipt.py),
    and the prompt cut into text segments by block and by where its K/V came from, for the chat page's
    provenance view."""
    metrics = final.metrics
    completion_tokens = sum(len(o.token_ids) for o in final.outputs)
    ttft_ms = None if metrics.ttft is None else round(metrics.ttft * 1000, 1)
    elapsed = (metrics.finished_time or metrics.arrival_time) - metrics.arrival_time
    done = {
        "outputs": [_output(o, decode, metrics, prompt_logprobs(final.prompt_logprobs)) for o in final.outputs],
        "usage": {
            "prompt_tokens": len(final.prompt_token_ids),
            "completion_tokens": completion_tokens,
            "cached_tokens": final.num_cached_tokens,
        },
        "timing": {
            "ttft_ms": ttft_ms,
            "tokens_per_s": round(completion_tokens / elapsed, 2) if elapsed > 0 else None,
        },
    }
    if block_size is not None:
        from inference.receipt import cache_receipt

        receipt = cache_receipt(metrics, block_size, completion_tokens)
        done["receipt"] = receipt.to_dict()
        if decode is not None:
            done["prompt_segments"] = prompt_segments(final.prompt_token_ids, receipt.provenance, block_size, decode)
    return done


def prompt_segments(
    token_ids: list[int], provenance: list[list], block_size: int, decode: Callable[[list[int]], str]
) -> list[dict[str, Any]]:
    """The prompt's text in pieces that each lie in one block and share one source (cached / computed /
    recomputed): what the chat page colours, with block boundaries."""
    segments = []
    for start, end, source in provenance:
        cut = start
        while cut < end:
            block = cut // block_size
            stop = min(end, (block + 1) * block_size)
            segments.append({"text": decode(token_ids[cut:stop]), "source": source, "block": block})
            cut = stop
    return segments


def _output(output: Any, decode: Callable[[list[int]], str] | None, metrics: Any,
            prompt: list[dict[str, dict[str, Any]] | None] | None) -> dict[str, Any]:
    summary = {"index": output.index, "text": output.text, "finish_reason": output.finish_reason,
               "completion_tokens": len(output.token_ids)}
    if prompt is not None:  # the request's, on each of its outputs: each is a choice of its own in the API
        summary["prompt_logprobs"] = prompt
    if output.logprobs is not None and decode is not None:
        summary["logprobs"] = token_logprobs(output.token_ids, output.logprobs, lambda t: decode([t]))
    if output.index in metrics.masked_tokens:
        summary["grammar_mask"] = {"removed": metrics.masked_tokens[output.index],
                                   "vocab_size": metrics.mask_vocab_size}
    return summary


def prompt_logprobs(entries: list[dict[int, Any] | None] | None) -> list[dict[str, dict[str, Any]] | None] | None:
    """`RequestOutput.prompt_logprobs` as vLLM's server writes it: per prompt token None (the first) or
    {token id: {logprob, rank, decoded_token}}, a -inf logprob as -9999.0 (JSON has no infinity; vLLM's value)."""
    if entries is None:
        return None
    return [None if entry is None else {
        str(token): {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank, "decoded_token": lp.decoded_token}
        for token, lp in entry.items()} for entry in entries]


def token_logprobs(
    token_ids: list[int], logprobs: list[dict[int, float]], decode: Callable[[int], str]
) -> list[dict[str, Any]]:
    """Per generated token: its text and logprob, and the top alternatives, most likely first. The engine
    gives one {token id: logprob} dict per token holding the sampled token and the top-k ones."""
    entries = []
    for token_id, candidates in zip(token_ids, logprobs):
        top = sorted(candidates.items(), key=lambda item: -item[1])
        chosen = candidates.get(token_id)
        entries.append(
            {
                "token": decode(token_id),
                "logprob": chosen,
                "top": [{"token": decode(t), "logprob": lp} for t, lp in top],
            }
        )
    return entries
