"""The OpenAI-compatible endpoints (docs/api.md): /v1/models, /v1/completions, /v1/chat/completions,
/v1/responses, and vLLM's /health, /version, /tokenize and /detokenize.

A request is authenticated (API key, or none from a local client where allowed: `auth`), validated (`schema`), admitted under the user's limits
(`accounts.limits`), and then generated over the same Celery -> engine -> channel-layer path as the chat
socket, through the same request lifecycle (`serving.web.lifecycle`). The first update is awaited before
answering, so a request the engine refuses (prompt too long...) gets a 400 even when streaming was asked for.
"""
import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from playground.accounts import limits, salt
from playground.serving.shared import registry
from playground.serving.web import lifecycle, sampling
from playground.serving.web.lifecycle import Generation, GenerationFailed, Job, Update
from playground.serving.web.models import (
    adapter_for, aserved_max_model_len, aserved_sampling_suggestions, base_model, served_models,
)

from . import response_api
from .auth import authenticate
from .batch import Batch, combine, renumber
from .errors import ApiError
from .response_api import ResponseShape
from .responses import RunningUsage, Shape, sse
from .schema import ApiRequest, parse_body, parse_chat, parse_completion
from .structured import api_message
from .tokenization import TokenizerRequest, parse_detokenize, parse_tokenize

# Unknown request fields are ignored (vLLM does so too, with a log line); their names come back in this header.
IGNORED_FIELDS_HEADER = "X-Ignored-Fields"
SERVER_VERSION = "0.1.0"
# Request fields only the worker can check in full (it has the tokenizer): its refusal names them.
WORKER_CHECKED = {"logit_bias"}
FAILURE_STATUS = {"invalid_request": 400, "unavailable": 503, "timeout": 504, "server_error": 500}


def _read_body(request: HttpRequest) -> dict[str, Any]:
    max_bytes = settings.PLAYGROUND_API["max_body_bytes"]
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        raise ApiError(400, "bad Content-Length header") from None
    if declared > max_bytes:
        raise ApiError(413, f"request body larger than {max_bytes} bytes", code="request_too_large")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, f"request body larger than {max_bytes} bytes", code="request_too_large") from None
    return parse_body(raw, settings.PLAYGROUND_LIMITS, max_bytes)


def _refusal(exc: GenerationFailed, message: str, param: str | None) -> ApiError:
    """A failed generation or tokenizer job as the API answers it: its status by the worker's code; a 400 (the
    worker refused the input) names `param` and carries the code."""
    status = FAILURE_STATUS.get(exc.code, 500)
    return ApiError(status, message, param=param if status == 400 else None, code=exc.code if status == 400 else None)


def _failure(exc: GenerationFailed, api_request: ApiRequest) -> ApiError:
    # A refusal the engine words "<field>: why" (logit_bias's ids outside the vocabulary) names the field.
    param = next((f for f in WORKER_CHECKED if str(exc).startswith(f"{f}: ")), None)
    return _refusal(exc, api_message(api_request.structured, str(exc)), param)


def _method_not_allowed(allowed: str) -> HttpResponse:
    return ApiError(405, f"use {allowed}", headers={"Allow": allowed}).response()


def _rate_limited(exc: limits.LimitExceeded) -> HttpResponse:
    return ApiError(429, str(exc), code="rate_limit_exceeded", headers={"Retry-After": str(exc.retry_after)}).response()


async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        await authenticate(request)
    except ApiError as exc:
        return exc.response()
    base, max_model_len = base_model(), await aserved_max_model_len()
    # As vLLM lists LoRA adapters: each one a model whose parent (and root) is the base model.
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "paged-playground", "root": base,
             "parent": None if name == base else base, "max_model_len": max_model_len}
            for name in served_models()]
    return JsonResponse({"object": "list", "data": data})


async def health(request: HttpRequest) -> HttpResponse:
    """vLLM's liveness probe: 200 (empty) while a GPU worker's engine is ready, 503 otherwise. No key needed."""
    try:
        workers = await registry.alive_workers()
    except Exception:
        workers = []
    if any(w.get("state") == "ready" for w in workers):
        return HttpResponse(status=200)
    return ApiError(503, "no GPU worker is ready", code="unavailable").response()


async def version(request: HttpRequest) -> HttpResponse:
    """vLLM answers its own version; this server answers its own (no key needed)."""
    return JsonResponse({"version": SERVER_VERSION})


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, "chat")


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, "completions")


@csrf_exempt
async def responses(request: HttpRequest) -> HttpResponse:
    return await _complete(request, "responses")


@csrf_exempt
async def tokenize(request: HttpRequest) -> HttpResponse:
    return await _tokenizer(request, parse_tokenize)


@csrf_exempt
async def detokenize(request: HttpRequest) -> HttpResponse:
    return await _tokenizer(request, parse_detokenize)


async def _tokenizer(request: HttpRequest, parse: Callable[..., TokenizerRequest]) -> HttpResponse:
    """vLLM's /tokenize and /detokenize: the worker, which owns the tokenizer and the chat template, answers a
    tokenizer job through the same lifecycle (and the same key, limits and slot) as a generation."""
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        caller = await authenticate(request)
        parsed = parse(_read_body(request), served_models(), settings.PLAYGROUND_LIMITS,
                       settings.PLAYGROUND_API["max_prompt_chars"])
        generation = await lifecycle.admit(caller.admit)
    except limits.LimitExceeded as exc:
        return _rate_limited(exc)
    except ApiError as exc:
        return exc.response()
    async with generation:
        try:
            await generation.start(parsed.job)
            done = [update.done async for update in generation.updates() if update.done is not None][0]
        except GenerationFailed as exc:
            return _refusal(exc, str(exc), parsed.param).response()
    response = JsonResponse({key: done[key] for key in parsed.answer})
    if parsed.ignored:
        response[IGNORED_FIELDS_HEADER] = ", ".join(parsed.ignored)
    return response


def _parse(endpoint: str, body: dict[str, Any], suggested: dict[str, Any]) -> ApiRequest:
    caps = settings.PLAYGROUND_LIMITS
    defaults = sampling.api_defaults(endpoint != "completions", caps, suggested)
    if endpoint == "completions":
        return parse_completion(body, served_models(), defaults, caps, settings.PLAYGROUND_API["max_prompt_chars"])
    if endpoint == "chat":
        return parse_chat(body, served_models(), defaults, caps)
    chat, ignored = response_api.to_chat(body)
    return replace(parse_chat(chat, served_models(), defaults, caps), ignored=ignored)


async def _complete(request: HttpRequest, endpoint: str) -> HttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        caller = await authenticate(request)
        body = _read_body(request)
        api_request = _parse(endpoint, body, await aserved_sampling_suggestions())
        jobs = _jobs(api_request, salt.cache_salt(caller.identity))
        batch = Batch(await _admit(len(jobs), caller.admit), api_request.params["n"])
    except limits.LimitExceeded as exc:
        return _rate_limited(exc)
    except ApiError as exc:
        return exc.response()

    request_id = batch.generations[0].request_id
    if endpoint == "responses":
        shape: Shape | ResponseShape = ResponseShape(api_request, request_id, body.get("instructions"))
    else:
        shape = Shape(endpoint == "chat", api_request, request_id)
    try:  # the first updates before answering: a request the engine refuses is a 400 even when streaming
        firsts = await batch.start(jobs)
    except GenerationFailed as exc:
        await batch.close()
        return _failure(exc, api_request).response()
    except BaseException:
        await batch.close()
        raise
    if api_request.stream:
        events = _stream_response(shape, batch, firsts) if endpoint == "responses" else _stream(shape, batch, firsts)
        response = StreamingHttpResponse(events, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # no proxy buffering of the event stream
    else:
        async with batch:
            try:
                done = await batch.result(firsts)
            except GenerationFailed as exc:
                return _failure(exc, api_request).response()
        response = JsonResponse(shape.response(done) if endpoint == "responses" else shape.completion(done))
    if api_request.ignored:
        response[IGNORED_FIELDS_HEADER] = ", ".join(api_request.ignored)
    return response


def _jobs(api_request: ApiRequest, cache_salt: str) -> list[Job]:
    """One envelope per generation: the chat, or each prompt of a completions batch."""
    common = {"params": api_request.params, "cache_salt": cache_salt, "adapter": adapter_for(api_request.model),
              **api_request.job_options}
    if api_request.messages is not None:
        return [Job(messages=api_request.messages, **common)]
    return [Job(prompt=prompt, **common) for prompt in api_request.prompts]


async def _admit(count: int, take_slot: Callable[[], lifecycle.Slot]) -> list[Generation]:
    """A concurrency slot per generation (a batch of prompts counts as that many requests), all or none."""
    generations: list[Generation] = []
    try:
        for _ in range(count):
            generations.append(await lifecycle.admit(take_slot))
    except BaseException:
        await asyncio.gather(*(g.close() for g in generations))
        raise
    return generations


async def _stream(shape: Shape, batch: Batch, firsts: list[Update]) -> AsyncIterator[bytes]:
    """Server-sent events: opening chunks, text deltas, each choice's closing chunk, optional usage, [DONE].
    With continuous_usage_stats each chunk but the last carries its choice's usage so far."""
    sent: dict[int, str] = {}
    dones: dict[int, dict[str, Any]] = {}
    running = RunningUsage(batch.n)
    for k, first in enumerate(firsts):
        running.start(k, first)

    def event(chunk: dict[str, Any]) -> bytes:
        return sse(running.stamp(chunk) if shape.request.continuous_usage else chunk)

    async with batch:
        try:
            for chunk in shape.first_chunks():
                yield event(chunk)
            async for k, update in batch.updates(firsts):
                running.update(k, update)
                for piece in update.chunks if shape.streams_text else []:
                    index = k * batch.n + piece["index"]
                    sent[index] = sent.get(index, "") + piece["text"]
                    yield event(shape.chunk(index, piece["text"]))
                if update.done is not None:
                    dones[k] = renumber(update.done, k, batch.n)
                    for chunk in shape.final_chunks(dones[k], sent):
                        yield event(chunk)
            if shape.request.include_usage:
                yield sse(shape.usage_chunk(combine([dones[k] for k in sorted(dones)])))
        except GenerationFailed as exc:
            yield sse(_failure(exc, shape.request).body())
    yield sse("[DONE]")


async def _stream_response(shape: ResponseShape, batch: Batch, firsts: list[Update]) -> AsyncIterator[bytes]:
    """The Responses API's events: created, in progress, the text deltas, the closing events (no [DONE])."""
    async with batch:
        try:
            for event in shape.opening():
                yield event
            async for _, update in batch.updates(firsts):
                for piece in update.chunks:
                    yield shape.delta(piece["text"])
                if update.done is not None:
                    for event in shape.closing(update.done):
                        yield event
        except GenerationFailed as exc:
            yield shape.failure(_failure(exc, shape.request).body())
