"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions (docs/api.md).

A request is authenticated (API key, or none from a local client where allowed: `auth`), validated (`schema`), admitted under the user's limits
(`accounts.limits`), and then generated over the same Celery -> engine -> channel-layer path as the chat
socket, through the same request lifecycle (`serving.web.lifecycle`). The first update is awaited before
answering, so a request the engine refuses (prompt too long...) gets a 400 even when streaming was asked for.
"""
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from playground.accounts import limits, salt
from playground.serving.web import lifecycle, sampling
from playground.serving.web.lifecycle import Generation, GenerationFailed, Job, Update
from playground.serving.web.models import adapter_for, base_model, served_models

from .auth import authenticate
from .errors import ApiError
from .responses import Shape, sse
from .schema import ApiRequest, parse_body, parse_chat, parse_completion
from .structured import api_message

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
        caller = await authenticate(request)
        body = _read_body(request)
        caps = settings.PLAYGROUND_LIMITS
        defaults = sampling.api_defaults(chat, caps)
        if chat:
            api_request = parse_chat(body, served_models(), defaults, caps)
        else:
            api_request = parse_completion(body, served_models(), defaults, caps,
                                           settings.PLAYGROUND_API["max_prompt_chars"])  # fmt: skip
        generation = await lifecycle.admit(caller.admit)
    except limits.LimitExceeded as exc:
        headers = {"Retry-After": str(exc.retry_after)}
        return ApiError(429, str(exc), code="rate_limit_exceeded", headers=headers).response()
    except ApiError as exc:
        return exc.response()

    job = Job(params=api_request.params, messages=api_request.messages, prompt=api_request.prompt,
              cache_salt=salt.cache_salt(caller.identity), adapter=adapter_for(api_request.model))  # fmt: skip
    shape = Shape(chat, api_request, generation.request_id)
    updates = generation.updates()
    try:  # the first update before answering: a request the engine refuses is a 400 even when streaming
        await generation.start(job)
        first = await anext(updates)
    except GenerationFailed as exc:
        await generation.close()
        return _failure(exc, api_request).response()
    except BaseException:
        await generation.close()
        raise
    if api_request.stream:
        response = StreamingHttpResponse(_stream(shape, generation, first, updates), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # no proxy buffering of the event stream
        return response
    async with generation:
        try:
            done = first.done or await _last(updates)
        except GenerationFailed as exc:
            return _failure(exc, api_request).response()
    return JsonResponse(shape.completion(done))


async def _last(updates: AsyncIterator[Update]) -> dict[str, Any]:
    """Skip the text deltas; the done event carries the full texts."""
    async for update in updates:
        if update.done is not None:
            return update.done
    raise GenerationFailed("the request ended without a result")


async def _stream(shape: Shape, generation: Generation, first: Update,
                  updates: AsyncIterator[Update]) -> AsyncIterator[bytes]:  # fmt: skip
    """Server-sent events: role chunks, text deltas, closing chunks, optional usage, then [DONE]."""
    sent: dict[int, str] = {}
    async with generation:
        try:
            for chunk in shape.first_chunks():
                yield sse(chunk)
            update = first
            while True:
                for piece in update.chunks if shape.streams_text else []:
                    sent[piece["index"]] = sent.get(piece["index"], "") + piece["text"]
                    yield sse(shape.chunk(piece["index"], piece["text"]))
                if update.done is not None:
                    for chunk in shape.final_chunks(update.done, sent):
                        yield sse(chunk)
                    if shape.request.include_usage:
                        yield sse(shape.usage_chunk(update.done))
                    break
                update = await anext(updates)
        except GenerationFailed as exc:
            yield sse(_failure(exc, shape.request).body())
        except StopAsyncIteration:
            yield sse(ApiError(500, "the request ended without a result").body())
    yield sse("[DONE]")
