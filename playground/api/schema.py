"""Validation of OpenAI-style request bodies into a serving Job (docs/api.md lists what is accepted).

Sampling fields go through the same validator as the websocket (`serving.web.sampling.validate_sampling`), so
both front doors accept the same ranges and enforce the same server caps. Anything unknown, unsupported
or out of range raises `ApiError` (HTTP 400) naming the field.
"""
import re
from collections.abc import Mapping, Sequence
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from playground.chat.protocol import parse_messages
from playground.serving.web.edge import InvalidInput, TooLarge, parse_json_object
from playground.serving.web.sampling import API_NAMES as SAMPLING
from playground.serving.web.sampling import validate_sampling

from . import structured
from .errors import ApiError
from .structured import Structured

logger = logging.getLogger(__name__)

# Accepted and ignored: bookkeeping fields some clients always send.
IGNORED = {"user", "metadata", "store", "service_tier"}
# vLLM's extra sampling fields, beyond the sampling table's (serving/web/sampling.py), with their checks.
EXTRA_SAMPLING = {"min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
                  "logit_bias"}
# Known, but honoured only at their default: any other value is a 400 naming the field.
DEFAULT_ONLY = {"spaces_between_special_tokens": True, "suffix": None}
# (prompt_logprobs is no sampling extra: the Responses API, which passes those on, has no place for them.)
PROMPT_FIELDS = {"echo", "truncate_prompt_tokens", "prompt_logprobs"}
TEMPLATE_FIELDS = {"add_generation_prompt", "continue_final_message", "chat_template_kwargs"}
COMMON = ({"model", "stream", "stream_options", "logprobs"} | SAMPLING | EXTRA_SAMPLING | set(DEFAULT_ONLY)
          | PROMPT_FIELDS | IGNORED)
CHAT_FIELDS = COMMON | {"messages", "top_logprobs", "max_completion_tokens"} | TEMPLATE_FIELDS | structured.FIELDS
COMPLETION_FIELDS = COMMON | {"prompt", "best_of"}
MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_STOP_TOKEN_IDS = 64
MAX_PROMPT_LOGPROBS = 20  # the engine's SamplingParams.MAX_LOGPROBS (vLLM's default max_logprobs)
MAX_PROMPTS = 16  # prompts in one /v1/completions request
MAX_TOKEN_ID = 2**31 - 1
FIELD_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # what an ignored field's name must look like to be echoed

Prompt = str | list[int]


@dataclass(frozen=True)
class ApiRequest:
    """A validated request: what to generate and how to answer.

    A chat has `messages`; a completion has `prompts` (one or more, each text or token ids), each served as
    its own generation, choice `i * n + j` being prompt i's sample j (vLLM's numbering). `echo` holds, per
    prompt, the text the reply starts with (the prompt, with `echo`), else "". `ignored` names the unknown
    fields that were dropped (reported in the X-Ignored-Fields header)."""

    model: str
    params: dict[str, Any]  # SamplingParams kwargs
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    top_logprobs: int | None  # alternatives per token to return; None = no logprobs
    messages: list[dict[str, Any]] | None = None
    prompts: list[Prompt] | None = None
    structured: Structured | None = None  # response_format / tools (chat only)
    echo: list[str] = field(default_factory=list)
    job_options: dict[str, Any] = field(default_factory=dict)  # Job's template and truncation fields
    ignored: list[str] = field(default_factory=list)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage): usage in every chunk


def parse_body(raw: bytes, limits: Mapping[str, int], max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, by the edge's rules (serving/web/edge.py): 413 over `max_bytes`, else 400."""
    try:
        return parse_json_object(raw, max_bytes, limits["max_json_depth"], what="request body", allow_nul=True)
    except TooLarge as exc:
        raise ApiError(413, str(exc), code="request_too_large") from None
    except InvalidInput as exc:
        raise ApiError(400, str(exc)) from None


def _known(body: Mapping[str, Any], allowed: set[str]) -> list[str]:
    """The unknown fields of `body`, which are ignored (as vLLM does: strict parsing broke clients that send
    their own extras) but logged; their printable names go back in the X-Ignored-Fields header."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        logger.warning("ignored unknown request field(s): %s", ", ".join(unknown)[:500])
    return [name for name in unknown if FIELD_NAME.match(name)][:20]


def _defaults_only(body: Mapping[str, Any]) -> None:
    """Fields we know but honour only at their default (`DEFAULT_ONLY`): any other value is refused by name."""
    for name, default in DEFAULT_ONLY.items():
        value = body.get(name, default)
        if value != default and not (default is None and value in ({}, [])):
            raise ApiError(400, f"{name} is not supported (only its default, {json.dumps(default)})", param=name)


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
                       param="model", code="model_not_found")
    return model


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise ApiError(400, "stream_options must be an object with include_usage and/or continuous_usage_stats",
                       param="stream_options")
    _bool(options, "continuous_usage_stats")  # checked here, read by _continuous_usage
    return _bool(options, "include_usage")


def _continuous_usage(body: Mapping[str, Any], stream: bool) -> bool:
    """vLLM's rule: the usage so far in every chunk only when include_usage is true too (else it is ignored)."""
    options = body.get("stream_options")
    return _stream_options(body, stream) and _bool(options, "continuous_usage_stats")


def _extra_sampling(body: Mapping[str, Any], max_tokens: int) -> dict[str, Any]:
    """vLLM's extra SamplingParams fields, checked here so a bad value is a 400 before any worker sees it."""
    extras: dict[str, Any] = {}
    for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
        if body.get(name) is not None:
            extras[name] = _bool(body, name)
    min_tokens = _int_or_none(body, "min_tokens", 0, max_tokens)
    if min_tokens is not None:
        extras["min_tokens"] = min_tokens
    ids = body.get("stop_token_ids")
    if ids is not None:
        if (not isinstance(ids, list) or len(ids) > MAX_STOP_TOKEN_IDS
                or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in ids)):
            raise ApiError(400, f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids",
                           param="stop_token_ids")
        extras["stop_token_ids"] = ids
    bias = _logit_bias(body.get("logit_bias"))
    if bias:
        extras["logit_bias"] = bias
    prompt_logprobs = _int_or_none(body, "prompt_logprobs", 0, MAX_PROMPT_LOGPROBS)
    if prompt_logprobs is not None:
        if prompt_logprobs > 0 and body.get("stream") is True:  # vLLM's rule: they come with the whole response
            raise ApiError(400, "prompt_logprobs are not available when stream=true", param="prompt_logprobs")
        if body.get("stream") is not True:  # a stream's 0 (vLLM accepts it) returns nothing: not computed
            extras["prompt_logprobs"] = prompt_logprobs
    return extras


def _logit_bias(raw: Any) -> dict[str, float]:
    """OpenAI's logit_bias: {token id (as a string: JSON keys are) -> bias}, each bias clamped to [-100, 100] as
    OpenAI and vLLM do. Whether the ids are in the vocabulary is the worker's check (the web side has no
    tokenizer): its refusal is a 400 naming logit_bias too."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ApiError(400, "logit_bias must be an object mapping token ids to biases", param="logit_bias")
    bias = {}
    for token, value in raw.items():
        if not re.fullmatch(r"[0-9]{1,10}", token) or int(token) > MAX_TOKEN_ID:
            raise ApiError(400, f"logit_bias keys must be token ids (non-negative integers), got {token[:40]!r}",
                           param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ApiError(400, f"logit_bias values must be numbers, got {json.dumps(value)[:40]} for {token}",
                           param="logit_bias")
        bias[str(int(token))] = min(100.0, max(-100.0, float(value)))
    return bias


def _truncation(body: Mapping[str, Any]) -> dict[str, Any]:
    """truncate_prompt_tokens: keep the prompt's last k tokens (k >= 1; vLLM's -1, "the model's length", is
    refused: the worker knows that length, the web side does not)."""
    k = _int_or_none(body, "truncate_prompt_tokens", 1, MAX_TOKEN_ID)
    return {} if k is None else {"truncate_prompt_tokens": k}


def _sampling(body: Mapping[str, Any], defaults: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, Any]:
    given = {k: v for k, v in body.items() if k in SAMPLING and v is not None}
    try:
        return validate_sampling(given, defaults, limits)
    except InvalidInput as exc:
        message = str(exc).removeprefix("params.")
        found = re.match(r"\w+", message)
        raise ApiError(400, message, param=found.group(0) if found else None) from None


def _text_content(content: Any, i: int) -> Any:
    """OpenAI content may be a string or a list of parts; only text parts are supported (an image or audio
    part is a 400 naming it)."""
    if not isinstance(content, list):
        return content
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"{kind!r} content parts are" if isinstance(kind, str) else "content parts other than text are"
            raise ApiError(400, f"messages[{i}].content[{k}]: {what} not supported (text only)", param="messages")
        texts.append(part["text"])
    return "".join(texts)


def _chat_messages(raw: Any, limits: Mapping[str, int], continue_final: bool) -> list[dict[str, Any]]:
    """The transcript, checked as the chat socket's (`parse_messages`); `developer` is the system role, `name`
    is kept. With `continue_final`, the last message is the assistant's unfinished reply."""
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    messages, names = [], {}
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or set(message) - {"role", "content", "name", "tool_call_id"}:
            raise ApiError(400, f"messages[{i}] must be an object with role, content and optionally name",
                           param="messages")
        role = "system" if message.get("role") == "developer" else message.get("role")
        messages.append({"role": role, "content": _text_content(message.get("content"), i)})
        if isinstance(message.get("name"), str):
            names[i] = message["name"][: limits["max_message_chars"]]
    prefill = None
    if continue_final:
        if messages[-1]["role"] != "assistant" or not isinstance(messages[-1]["content"], str):
            raise ApiError(400, "continue_final_message needs a last message with role 'assistant'",
                           param="continue_final_message")
        prefill = messages.pop()
        if len(prefill["content"]) > limits["max_message_chars"]:
            raise ApiError(400, "the final assistant message is too long", param="messages")
    try:
        clean = parse_messages(messages, limits)
    except InvalidInput as exc:
        raise ApiError(400, str(exc), param="messages") from None
    for i, name in names.items():
        if i < len(clean):
            clean[i]["name"] = name
    return clean + ([prefill] if prefill else [])


def _template_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """add_generation_prompt (default true), continue_final_message (default false; vLLM's rule: not both) and
    chat_template_kwargs (extra variables for the chat template)."""
    continue_final = _bool(body, "continue_final_message")
    # vLLM defaults add_generation_prompt to true and refuses both; here it defaults to "not continuing".
    add = not continue_final if body.get("add_generation_prompt") is None else _bool(body, "add_generation_prompt")
    if add and continue_final:
        raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true",
                       param="continue_final_message")
    options: dict[str, Any] = {"add_generation_prompt": add, "continue_final_message": continue_final}
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
            raise ApiError(400, "chat_template_kwargs must be an object of template variables",
                           param="chat_template_kwargs")
        reserved = sorted(set(kwargs) & {"messages", "add_generation_prompt", "continue_final_message", "tools",
                                         "tokenize", "chat_template", "return_dict"})
        if reserved:
            raise ApiError(400, f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs")
        options["chat_template_kwargs"] = kwargs
    return options


def _max_tokens(body: Mapping[str, Any]) -> dict[str, Any]:
    """max_completion_tokens is OpenAI's newer name for max_tokens."""
    if body.get("max_completion_tokens") is None:
        return dict(body)
    if body.get("max_tokens") is not None:
        raise ApiError(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
    return {**body, "max_tokens": body["max_completion_tokens"]}


def _common(body: Mapping[str, Any], defaults: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, Any]:
    """What both endpoints read alike: the sampling fields, vLLM's extras, the default-only fields."""
    _defaults_only(body)
    params = _sampling(body, defaults, limits)
    return {**params, **_extra_sampling(body, params["max_tokens"])}


def parse_chat(body: Mapping[str, Any], served_models: Sequence[str], defaults: Mapping[str, Any],
               limits: Mapping[str, int]) -> ApiRequest:
    """POST /v1/chat/completions."""
    ignored = _known(body, CHAT_FIELDS)
    model = _model(body, served_models)
    body = _max_tokens(body)
    stream = _bool(body, "stream")
    top = _int_or_none(body, "top_logprobs", 0, MAX_CHAT_TOP_LOGPROBS)
    if top is not None and not _bool(body, "logprobs"):
        raise ApiError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    top_logprobs = (top or 0) if _bool(body, "logprobs") else None
    params = _common(body, defaults, limits)
    options = _template_options(body)
    wanted = structured.parse(body)
    messages = _chat_messages(structured.plain_messages(body.get("messages")), limits,
                              options["continue_final_message"])
    if wanted.constraint is not None:
        params["structured_outputs"] = wanted.constraint
    # vLLM's chat echo: a reply that continues the final assistant message starts with that message.
    echo = messages[-1]["content"] if _bool(body, "echo") and options["continue_final_message"] else ""
    return ApiRequest(
        model=model,
        params={**params, "logprobs": top_logprobs},
        stream=stream,
        include_usage=_stream_options(body, stream),
        top_logprobs=top_logprobs,
        messages=structured.with_tool_prompt(messages, wanted),
        structured=wanted,
        echo=[echo],
        job_options={**options, **_truncation(body)},
        ignored=ignored,
        continuous_usage=_continuous_usage(body, stream),
    )


def _prompts(raw: Any, max_prompt_chars: int) -> list[Prompt]:
    """A completions `prompt`: a string, a list of token ids, or a list of either (a batch)."""
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "prompt must be a string, a list of token ids, or a non-empty list of either",
                       param="prompt")
    if len(raw) > MAX_PROMPTS:
        raise ApiError(400, f"at most {MAX_PROMPTS} prompts in one request", param="prompt")
    for prompt in raw:
        if isinstance(prompt, str):
            size = len(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            size = len(prompt)
            if not all(0 <= t <= MAX_TOKEN_ID for t in prompt):
                raise ApiError(400, "prompt token ids must be non-negative integers", param="prompt")
        else:
            raise ApiError(400, "each prompt must be a string or a list of token ids", param="prompt")
        if size == 0:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        if size > max_prompt_chars:
            raise ApiError(400, f"prompt is longer than {max_prompt_chars} characters", param="prompt",
                           code="context_length_exceeded")
    return raw


def parse_completion(body: Mapping[str, Any], served_models: Sequence[str], defaults: Mapping[str, Any],
                     limits: Mapping[str, int], max_prompt_chars: int) -> ApiRequest:
    """POST /v1/completions: one prompt or a batch of them."""
    ignored = _known(body, COMPLETION_FIELDS)
    model = _model(body, served_models)
    prompts = _prompts(body.get("prompt"), max_prompt_chars)
    params = _common(body, defaults, limits)
    best_of = body.get("best_of")
    if best_of is not None and best_of != params["n"]:
        raise ApiError(400, "best_of must equal n (no server-side ranking)", param="best_of")
    echo = _bool(body, "echo")
    if echo and not all(isinstance(p, str) for p in prompts):
        raise ApiError(400, "echo is supported for text prompts only", param="echo")
    stream = _bool(body, "stream")
    top_logprobs = _int_or_none(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    return ApiRequest(
        model=model,
        params={**params, "logprobs": top_logprobs},
        stream=stream,
        include_usage=_stream_options(body, stream),
        top_logprobs=top_logprobs,
        prompts=prompts,
        echo=[p if echo else "" for p in prompts],
        job_options=_truncation(body),
        ignored=ignored,
        continuous_usage=_continuous_usage(body, stream),
    )
