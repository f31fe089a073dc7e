"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions (docs/api.md).

A request is authenticated (API key), validated (`schema`), admitted under the user's limits
(`accounts.limits`), and then generated over the same Celery -> engine -> channel-layer path as the chat
socket (`serving.client`). The first worker event is awaited before answering, so a request the engine
refuses (prompt too long for the model...) gets a proper 400 even when streaming was asked for.
"""
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from playground.accounts import limits, salt
from playground.serving.web.lifecycle import GenerationFailed, Job, generate

from .auth import authenticate
from .errors import ApiError
from .responses import Shape, sse
from .schema import parse_body, parse_chat, parse_completion

FAILURE_STATUS = {"invalid_request": 400, "unavailable": 503, "server_error": 500}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _served_model() -> str:
    return settings.PLAYGROUND_ENGINE["model"]


def _defaults(chat: bool) -> dict[str, Any]:
    """OpenAI's defaults (temperature 1) over the playground's; completions default to 16 tokens."""
    defaults = {**settings.PLAYGROUND_SAMPLING_DEFAULTS, "temperature": 1.0, "stop": []}
    if not chat:
        defaults["max_tokens"] = min(COMPLETIONS_DEFAULT_MAX_TOKENS, settings.PLAYGROUND_LIMITS["max_tokens"])
    return defaults


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
    return parse_body(raw, max_bytes)


def _failure(exc: GenerationFailed) -> ApiError:
    status = FAILURE_STATUS.get(exc.code, 500)
    return ApiError(status, str(exc), code=exc.code if status == 400 else None)


def _method_not_allowed(allowed: str) -> HttpResponse:
    return ApiError(405, f"use {allowed}", headers={"Allow": allowed}).response()


async def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        await authenticate(request)
    except ApiError as exc:
        return exc.response()
    model = {"id": _served_model(), "object": "model", "created": 0, "owned_by": "paged-playground"}
    return JsonResponse({"object": "list", "data": [model]})


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
        if chat:
            api_request = parse_chat(body, _served_model(), _defaults(chat), caps)
        else:
            api_request = parse_completion(body, _served_model(), _defaults(chat), caps,
                                           settings.PLAYGROUND_API["max_prompt_chars"])  # fmt: skip
        who = limits.identity(key.user)
        quota = await sync_to_async(limits.quota_for, thread_sensitive=False)(key.user)
        admission = await sync_to_async(limits.admit, thread_sensitive=False)(who, quota)
    except limits.LimitExceeded as exc:
        headers = {"Retry-After": str(exc.retry_after)}
        return ApiError(429, str(exc), code="rate_limit_exceeded", headers=headers).response()
    except ApiError as exc:
        return exc.response()

    job = Job(params=api_request.params, messages=api_request.messages, prompt=api_request.prompt,
              cache_salt=salt.cache_salt(who))  # fmt: skip
    events = generate(job)
    shape = Shape(chat, api_request, job.request_id)
    try:
        first = await anext(events)
    except GenerationFailed as exc:
        await _finish(events, admission, None)
        return _failure(exc).response()
    except BaseException:
        await _finish(events, admission, None)
        raise
    if api_request.stream:
        response = StreamingHttpResponse(_stream(shape, first, events, admission), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # no proxy buffering of the event stream
        return response
    done = None
    try:
        done = first if first["type"] == "gen.done" else await _last(events)
    except GenerationFailed as exc:
        return _failure(exc).response()
    finally:
        await _finish(events, admission, done)
    return JsonResponse(shape.completion(done))


async def _last(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """Skip the token deltas; the done event carries the full texts."""
    async for event in events:
        if event["type"] == "gen.done":
            return event
    raise GenerationFailed("the request ended without a result")


async def _finish(events, admission: limits.Admission, done: dict[str, Any] | None) -> None:
    """Close the generation (aborting it if unfinished), give back the concurrency slot, count tokens."""
    await events.aclose()
    tokens = 0 if done is None else done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]

    def settle() -> None:
        admission.release()
        admission.record(tokens)

    await sync_to_async(settle, thread_sensitive=False)()


async def _stream(shape: Shape, first: dict[str, Any], events, admission: limits.Admission) -> AsyncIterator[bytes]:
    """Server-sent events: role chunks, text deltas, closing chunks, optional usage, then [DONE]."""
    sent: dict[int, str] = {}
    done = None
    try:
        for chunk in shape.first_chunks():
            yield sse(chunk)
        event = first
        while True:
            if event["type"] == "gen.done":
                done = event
                for chunk in shape.final_chunks(done, sent):
                    yield sse(chunk)
                if shape.request.include_usage:
                    yield sse(shape.usage_chunk(done))
                break
            for piece in event["chunks"]:
                sent[piece["index"]] = sent.get(piece["index"], "") + piece["text"]
                yield sse(shape.chunk(piece["index"], piece["text"]))
            event = await anext(events)
    except GenerationFailed as exc:
        yield sse(_failure(exc).body())
    except StopAsyncIteration:
        yield sse(ApiError(500, "the request ended without a result").body())
    finally:
        await _finish(events, admission, done)
    yield sse("[DONE]")
