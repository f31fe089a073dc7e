"""Validation of vLLM's /tokenize and /detokenize bodies into a tokenizer Job (docs/api.md).

The worker owns the tokenizer and the chat template, so the web side only checks the body and builds the
envelope (`Job.kind` "tokenize" / "detokenize"); a transcript is checked and shaped exactly as a chat
completion's (`schema._chat_messages`, `schema._template_options`), so /tokenize counts the prompt tokens
that chat completion would use.
"""
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from playground.serving.shared.envelope import Job

from . import structured
from .errors import ApiError
from .schema import MAX_TOKEN_ID, TEMPLATE_FIELDS, _bool, _chat_messages, _known, _model, _template_options

PROMPT_FIELDS = {"model", "prompt", "add_special_tokens", "return_token_strs"}
CHAT_FIELDS = {"model", "messages", "add_special_tokens", "return_token_strs"} | TEMPLATE_FIELDS
DETOKENIZE_FIELDS = {"model", "tokens"}


@dataclass(frozen=True)
class TokenizerRequest:
    """A validated /tokenize or /detokenize body: the worker's job, the input field a worker-side refusal
    names (an id outside the vocabulary, a transcript the template refuses), the `done` payload's keys that
    make the response, and the unknown fields dropped (the X-Ignored-Fields header)."""

    job: Job
    param: str
    answer: tuple[str, ...]
    ignored: list[str] = field(default_factory=list)


def _optional_model(body: Mapping[str, Any], served: Sequence[str]) -> None:
    """vLLM makes `model` optional here (the tokenizer is the served model's); given, it must be served."""
    if body.get("model") is not None:
        _model(body, served)


def parse_tokenize(body: Mapping[str, Any], served: Sequence[str], limits: Mapping[str, int],
                   max_prompt_chars: int) -> TokenizerRequest:
    """POST /tokenize: vLLM's TokenizeCompletionRequest (`prompt`) or TokenizeChatRequest (`messages`)."""
    _optional_model(body, served)
    strs = _bool(body, "return_token_strs")
    answer = ("count", "max_model_len", "tokens", "token_strs")
    if body.get("messages") is not None:
        if body.get("prompt") is not None:
            raise ApiError(400, "give prompt or messages, not both", param="prompt")
        ignored = _known(body, CHAT_FIELDS)
        if _bool(body, "add_special_tokens"):  # vLLM's default for a transcript; the template places its own
            raise ApiError(400, "add_special_tokens is not supported with messages (only its default, false)",
                           param="add_special_tokens")
        options = _template_options(body)
        messages = _chat_messages(structured.plain_messages(body["messages"]), limits,
                                  options["continue_final_message"])
        job = Job({}, messages=messages, kind="tokenize", return_token_strs=strs, **options)
        return TokenizerRequest(job, "messages", answer, ignored)
    ignored = _known(body, PROMPT_FIELDS)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string (or give messages)", param="prompt")
    if len(prompt) > max_prompt_chars:
        raise ApiError(400, f"prompt is longer than {max_prompt_chars} characters", param="prompt")
    special = body.get("add_special_tokens") is None or _bool(body, "add_special_tokens")  # vLLM: true
    job = Job({}, prompt=prompt, kind="tokenize", add_special_tokens=special, return_token_strs=strs)
    return TokenizerRequest(job, "prompt", answer, ignored)


def parse_detokenize(body: Mapping[str, Any], served: Sequence[str], limits: Mapping[str, int],
                     max_prompt_chars: int) -> TokenizerRequest:
    """POST /detokenize: vLLM's DetokenizeRequest. Ids past the vocabulary are refused by the worker."""
    _optional_model(body, served)
    ignored = _known(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if (not isinstance(tokens, list) or len(tokens) > max_prompt_chars
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in tokens)):
        raise ApiError(400, f"tokens must be a list of at most {max_prompt_chars} token ids", param="tokens")
    return TokenizerRequest(Job({}, prompt=tokens, kind="detokenize"), "tokens", ("prompt",), ignored)
