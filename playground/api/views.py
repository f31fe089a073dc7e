"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions (docs/api.md).

A request is authenticated (API key), validated (`schema`), admitted under the user's limits
(`accounts.limits`), and then generated over the same Celery -> engine -> channel-layer path as the chat
socket, through the same request lifecycle (`serving.web.lifecycle`). The first update is awaited before
answering, so a request the engine refuses (prompt too long...) gets a 400 even when streaming was asked for.
"""
import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from playground.accounts import limits, salt
from playground.serving.web import lifecycle, sampling
from playground.serving.web.lifecycle import Generation, GenerationFailed, Job, Update
from playground.serving.web.models import adapter_for, base_model, served_models

from .auth import authenticate
from .batch import Batch, combine, renumber
from .errors import ApiError
from .responses import Shape, sse
from .schema import ApiRequest, parse_body, parse_chat, parse_completion
from .structured import api_message

# Unknown request fields are ignored (vLLM does so too, with a log line); their names come back in this header.
IGNORED_FIELDS_HEADER = "X-Ignored-Fields"
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


def _failure(exc: GenerationFailed, api_request: ApiRequest) -> ApiError:
    status = FAILURE_STATUS.get(exc.code, 500)
    return ApiError(status, api_message(api_request.structured, str(exc)), code=exc.code if status == 400 else None)


def _method_not_allowed(allowed: str) -> HttpResponse:
    return ApiError(405, f"use {allowed}", headers={"Allow": allowed}).response()


async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        await authenticate(request)
    except ApiError as exc:
        return exc.response()
    base = base_model()
    # As vLLM lists LoRA adapters: each one a model whose parent is the base model.
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "paged-playground",
             "parent": None if name == base else base} for name in served_models()]
    return JsonResponse({"object": "list", "data": data})


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, chat=True)


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    return await _complete(request, chat=False)


async def _complete(request: HttpRequest, chat: bool) -> HttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        key = await authenticate(request)
        body = _read_body(request)
        caps = settings.PLAYGROUND_LIMITS
        defaults = sampling.api_defaults(chat, caps)
        if chat:
            api_request = parse_chat(body, served_models(), defaults, caps)
        else:
            api_request = parse_completion(body, served_models(), defaults, caps,
                                           settings.PLAYGROUND_API["max_prompt_chars"])  # fmt: skip
        who = limits.identity(key.user)
        quota = await sync_to_async(limits.quota_for, thread_sensitive=False)(key.user)
        jobs = _jobs(api_request, salt.cache_salt(who))
        batch = Batch(await _admit(len(jobs), lambda: limits.admit(who, quota)), api_request.params["n"])
    except limits.LimitExceeded as exc:
        headers = {"Retry-After": str(exc.retry_after)}
        return ApiError(429, str(exc), code="rate_limit_exceeded", headers=headers).response()
    except ApiError as exc:
        return exc.response()

    shape = Shape(chat, api_request, batch.generations[0].request_id)
    try:  # the first updates before answering: a request the engine refuses is a 400 even when streaming
        firsts = await batch.start(jobs)
    except GenerationFailed as exc:
        await batch.close()
        return _failure(exc, api_request).response()
    except BaseException:
        await batch.close()
        raise
    if api_request.stream:
        response = StreamingHttpResponse(_stream(shape, batch, firsts), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # no proxy buffering of the event stream
    else:
        async with batch:
            try:
                response = JsonResponse(shape.completion(await batch.result(firsts)))
            except GenerationFailed as exc:
                return _failure(exc, api_request).response()
    if api_request.ignored:
        response[IGNORED_FIELDS_HEADER] = ", ".join(api_request.ignored)
    return response


def _jobs(api_request: ApiRequest, cache_salt: str) -> list[Job]:
    """One envelope per generation: the chat, or each prompt of a completions batch."""
    common = {"params": api_request.params, "cache_salt": cache_salt, "adapter": adapter_for(api_request.model),
              **api_request.job_options}  # fmt: skip
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
    """Server-sent events: opening chunks, text deltas, each choice's closing chunk, optional usage, [DONE]."""
    sent: dict[int, str] = {}
    dones: dict[int, dict[str, Any]] = {}
    async with batch:
        try:
            for chunk in shape.first_chunks():
                yield sse(chunk)
            async for k, update in batch.updates(firsts):
                for piece in update.chunks if shape.streams_text else []:
                    index = k * batch.n + piece["index"]
                    sent[index] = sent.get(index, "") + piece["text"]
                    yield sse(shape.chunk(index, piece["text"]))
                if update.done is not None:
                    dones[k] = renumber(update.done, k, batch.n)
                    for chunk in shape.final_chunks(dones[k], sent):
                        yield sse(chunk)
            if shape.request.include_usage:
                yield sse(shape.usage_chunk(combine([dones[k] for k in sorted(dones)])))
        except GenerationFailed as exc:
            yield sse(_failure(exc, shape.request).body())
    yield sse("[DONE]")
