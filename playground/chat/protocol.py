"""Parsing and validation of the frames a browser sends on /ws/chat/ (docs/protocol.md).

Frames are decoded by `serving.web.edge.decode_frame` (size, nesting, JSON, Unicode); every check here
raises `InvalidInput` with a message fit for the client's error event.
"""
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playground.serving.web.edge import CLOSE_CODES, InvalidInput, decode_frame
from playground.serving.web.response_format import response_format_constraint
from playground.serving.web.sampling import validate_sampling

CLOSE_LOGIN_REQUIRED = CLOSE_CODES["login_required"]
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Generate:
    conversation_id: uuid.UUID | None
    messages: list[dict[str, str]]
    params: dict[str, Any]
    model: str | None = None  # the base model or a LoRA adapter's name (serving.web.models); None: base


@dataclass(frozen=True)
class Compare:
    """One prompt answered twice at once, under settings A and B (each a `Generate` without a conversation: a
    compare run is not saved, docs/protocol.md)."""
    sides: tuple[Generate, Generate]


@dataclass(frozen=True)
class Cancel:
    request_id: str


SIDE_NAMES = ("A", "B")


def parse_messages(messages: Any, limits: Mapping[str, int]) -> list[dict[str, str]]:
    """Check a chat transcript: roles, order (system first, user last), sizes."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list")
    if len(messages) > limits["max_messages"]:
        raise InvalidInput(f"at most {limits['max_messages']} messages")
    clean = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise InvalidInput(f"messages[{i}] must be an object with exactly 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise InvalidInput(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if role == "system" and i != 0:
            raise InvalidInput("only the first message may have role 'system'")
        if not isinstance(content, str):
            raise InvalidInput(f"messages[{i}].content must be a string")
        if len(content) > limits["max_message_chars"]:
            raise InvalidInput(f"messages[{i}].content is longer than {limits['max_message_chars']} characters")
        clean.append({"role": role, "content": content})
    if clean[-1]["role"] != "user":
        raise InvalidInput("the last message must have role 'user'")
    if not clean[-1]["content"].strip():
        raise InvalidInput("the last user message is empty")
    return clean


def parse_settings(frame: Mapping[str, Any], defaults: Mapping[str, Any], limits: Mapping[str, int]
                   ) -> tuple[dict[str, Any], str | None]:
    """The sampling `params` (with a `response_format`'s constraint) and the `model` of a generate frame or of a
    compare frame's side: one set of rules for both."""
    params = validate_sampling(frame.get("params"), defaults, limits)
    constraint = response_format_constraint(frame.get("response_format"))  # as on the API
    if constraint is not None:
        params["structured_outputs"] = constraint
    model = frame.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidInput("model must be a model name (string) or absent")
    return params, model


def parse_generate(frame: Mapping[str, Any], defaults: Mapping[str, Any], limits: Mapping[str, int]) -> Generate:
    unknown = sorted(set(frame) - {"type", "conversation_id", "messages", "params", "response_format", "model"})
    if unknown:
        raise InvalidInput(f"unknown field(s) in generate: {', '.join(unknown)}")
    raw_id = frame.get("conversation_id")
    conversation_id = None
    if raw_id is not None:
        try:
            conversation_id = uuid.UUID(str(raw_id)) if isinstance(raw_id, str) else None
        except ValueError:
            conversation_id = None
        if conversation_id is None:
            raise InvalidInput("conversation_id must be a UUID string or null")
    params, model = parse_settings(frame, defaults, limits)
    return Generate(conversation_id=conversation_id, messages=parse_messages(frame.get("messages"), limits),
                    params=params, model=model)


def parse_compare(frame: Mapping[str, Any], defaults: Mapping[str, Any], limits: Mapping[str, int]) -> Compare:
    """A compare frame: one transcript and exactly two sides, each checked as a generate frame's settings are; a
    side's error is prefixed with its name ("B: params.temperature ...")."""
    unknown = sorted(set(frame) - {"type", "messages", "sides"})
    if unknown:
        raise InvalidInput(f"unknown field(s) in compare: {', '.join(unknown)}")
    sides = frame.get("sides")
    if not isinstance(sides, list) or len(sides) != len(SIDE_NAMES):
        raise InvalidInput("sides must be a list of two objects (settings A and B)")
    messages = parse_messages(frame.get("messages"), limits)
    parsed = []
    for name, side in zip(SIDE_NAMES, sides):
        try:
            if not isinstance(side, dict):
                raise InvalidInput("must be an object with params, and optionally model and response_format")
            unknown = sorted(set(side) - {"params", "response_format", "model"})
            if unknown:
                raise InvalidInput(f"unknown field(s): {', '.join(unknown)}")
            params, model = parse_settings(side, defaults, limits)
        except InvalidInput as exc:
            raise InvalidInput(f"{name}: {exc}") from exc
        parsed.append(Generate(conversation_id=None, messages=messages, params=params, model=model))
    return Compare(sides=(parsed[0], parsed[1]))


def parse_cancel(frame: Mapping[str, Any]) -> Cancel:
    request_id = frame.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise InvalidInput("cancel needs a request_id string")
    return Cancel(request_id=request_id)


def parse_frame(text: str | None, defaults: Mapping[str, Any], limits: Mapping[str, int]
                ) -> Generate | Compare | Cancel:
    """One client frame, decoded at the edge and parsed: a Generate, a Compare or a Cancel; raises InvalidInput."""
    frame = decode_frame(text, limits)
    kind = frame.get("type")
    if kind == "generate":
        return parse_generate(frame, defaults, limits)
    if kind == "compare":
        return parse_compare(frame, defaults, limits)
    if kind == "cancel":
        return parse_cancel(frame)
    raise InvalidInput("type must be 'generate', 'compare' or 'cancel'")
