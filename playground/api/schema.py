"""Validation of OpenAI-style request bodies into a serving Job (docs/api.md lists what is accepted).

Sampling fields go through the same validator as the websocket (`serving.web.sampling.validate_sampling`), so
both front doors accept the same ranges and enforce the same server caps. Anything unknown, unsupported
or out of range raises `ApiError` (HTTP 400) naming the field.
"""
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playground.chat.protocol import parse_messages
from playground.serving.web.edge import InvalidInput, TooLarge, parse_json_object
from playground.serving.web.sampling import NAMES as SAMPLING
from playground.serving.web.sampling import validate_sampling

from . import structured
from .errors import ApiError
from .structured import Structured

# Accepted and ignored: bookkeeping fields some clients always send.
IGNORED = {"user", "metadata", "store", "service_tier"}
COMMON = {"model", "stream", "stream_options"} | SAMPLING | IGNORED
CHAT_FIELDS = COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens"} | structured.FIELDS
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}
MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5


@dataclass(frozen=True)
class ApiRequest:
    """A validated request: what to generate and how to answer."""

    model: str
    params: dict[str, Any]  # SamplingParams kwargs
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    top_logprobs: int | None  # alternatives per token to return; None = no logprobs
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    structured: Structured | None = None  # response_format / tools (chat only)


def parse_body(raw: bytes, limits: Mapping[str, int], max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, by the edge's rules (serving/web/edge.py): 413 over `max_bytes`, else 400."""
    try:
        return parse_json_object(raw, max_bytes, limits["max_json_depth"], what="request body")
    except TooLarge as exc:
        raise ApiError(413, str(exc), code="request_too_large") from None
    except InvalidInput as exc:
        raise ApiError(400, str(exc)) from None


def _check_fields(body: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"unsupported field(s): {', '.join(unknown)}", param=unknown[0])


def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean", param=name)
    return value


def _int_or_none(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"{name} must be an integer between {low} and {high}", param=name)
    return value


def _model(body: Mapping[str, Any], served: Sequence[str]) -> str:
    """The requested model: one of `served` (the base model and the LoRA adapters), else a 404."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required (see GET /v1/models)", param="model")
    if model not in served:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {', '.join(served)}",
                       param="model", code="model_not_found")  # fmt: skip
    return model


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise ApiError(400, "stream_options must be an object with only include_usage", param="stream_options")
    return _bool(options, "include_usage")


def _sampling(body: Mapping[str, Any], defaults: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, Any]:
    given = {k: v for k, v in body.items() if k in SAMPLING and v is not None}
    try:
        return validate_sampling(given, defaults, limits)
    except InvalidInput as exc:
        message = str(exc).removeprefix("params.")
        found = re.match(r"\w+", message)
        raise ApiError(400, message, param=found.group(0) if found else None) from None


def _text_content(content: Any, i: int) -> Any:
    """OpenAI content may be a string or a list of parts; only text parts are supported."""
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
        texts.append(part["text"])
    return "".join(texts)


def _chat_messages(raw: Any, limits: Mapping[str, int]) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise ApiError(400, f"messages[{i}] must be an object with role and content", param="messages")
        role = "system" if message.get("role") == "developer" else message.get("role")
        messages.append({"role": role, "content": _text_content(message.get("content"), i)})
    try:
        return parse_messages(messages, limits)
    except InvalidInput as exc:
        raise ApiError(400, str(exc), param="messages") from None


def parse_chat(body: Mapping[str, Any], served_models: Sequence[str], defaults: Mapping[str, Any],
               limits: Mapping[str, int]) -> ApiRequest:  # fmt: skip
    """POST /v1/chat/completions."""
    _check_fields(body, CHAT_FIELDS)
    model = _model(body, served_models)
    if body.get("max_completion_tokens") is not None:
        if body.get("max_tokens") is not None:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    stream = _bool(body, "stream")
    top = _int_or_none(body, "top_logprobs", 0, MAX_CHAT_TOP_LOGPROBS)
    if top is not None and not _bool(body, "logprobs"):
        raise ApiError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    top_logprobs = (top or 0) if _bool(body, "logprobs") else None
    params = _sampling(body, defaults, limits)
    wanted = structured.parse(body)
    messages = _chat_messages(structured.plain_messages(body.get("messages")), limits)
    if wanted.constraint is not None:
        params["structured_outputs"] = wanted.constraint
    return ApiRequest(
        model=model,
        params={**params, "logprobs": top_logprobs},
        stream=stream,
        include_usage=_stream_options(body, stream),
        top_logprobs=top_logprobs,
        messages=structured.with_tool_prompt(messages, wanted),
        structured=wanted,
    )


def parse_completion(body: Mapping[str, Any], served_models: Sequence[str], defaults: Mapping[str, Any],
                     limits: Mapping[str, int], max_prompt_chars: int) -> ApiRequest:  # fmt: skip
    """POST /v1/completions (one prompt per request)."""
    _check_fields(body, COMPLETION_FIELDS)
    model = _model(body, served_models)
    if _bool(body, "echo"):
        raise ApiError(400, "echo is not supported", param="echo")
    if body.get("suffix") is not None:
        raise ApiError(400, "suffix is not supported", param="suffix")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string (or a list holding one string)", param="prompt")
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    if len(prompt) > max_prompt_chars:
        raise ApiError(400, f"prompt is longer than {max_prompt_chars} characters", param="prompt",
                       code="context_length_exceeded")  # fmt: skip
    params = _sampling(body, defaults, limits)
    best_of = body.get("best_of")
    if best_of is not None and best_of != params["n"]:
        raise ApiError(400, "best_of must equal n (no server-side ranking)", param="best_of")
    stream = _bool(body, "stream")
    top_logprobs = _int_or_none(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    return ApiRequest(
        model=model,
        params={**params, "logprobs": top_logprobs},
        stream=stream,
        include_usage=_stream_options(body, stream),
        top_logprobs=top_logprobs,
        prompt=prompt,
    )
