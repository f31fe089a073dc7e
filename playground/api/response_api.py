"""OpenAI's Responses API (`POST /v1/responses`), text in and text out, over the chat path.

A request is turned into a chat (`instructions` as the system message, `input` as the turns) and served like
/v1/chat/completions; the answer is a `response` object with one assistant `message` item, or, streamed, the
Responses event sequence (response.created ... response.output_text.delta ... response.completed) as named
server-sent events. What the Responses API has beyond text (tools, previous_response_id, reasoning, other
text formats) is refused by name.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .schema import ApiRequest, EXTRA_SAMPLING, IGNORED, SAMPLING

# Fields with the same meaning as on chat (vLLM's extras included), passed through.
SHARED = {"model", "stream", "temperature", "top_p", "seed", "stop"} | (SAMPLING - {"max_tokens", "n"}) | EXTRA_SAMPLING
# Known; accepted only while they ask for nothing beyond text.
NOTHING_MORE = {"previous_response_id": None, "reasoning": None, "include": [], "tools": [], "truncation": "disabled",
                "top_logprobs": 0, "tool_choice": "auto", "parallel_tool_calls": True}
FIELDS = SHARED | set(NOTHING_MORE) | IGNORED | {"input", "instructions", "max_output_tokens", "text"}
ROLES = {"user", "assistant", "system", "developer"}


def to_chat(body: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The chat body that asks for the same generation, and the unknown fields (ignored, reported)."""
    for name, default in NOTHING_MORE.items():
        if body.get(name) not in (None, default):
            raise ApiError(400, f"{name} is not supported (text responses only)", param=name)
    text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text") or {}, dict) else "bad"
    if text_format not in (None, {"type": "text"}):
        raise ApiError(400, "text.format other than {\"type\": \"text\"} is not supported", param="text")
    messages = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise ApiError(400, "instructions must be a string", param="instructions")
        messages.append({"role": "system", "content": body["instructions"]})
    messages += _input_messages(body.get("input"))
    chat = {k: v for k, v in body.items() if k in SHARED}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat, sorted(set(body) - FIELDS)


def _input_messages(raw: Any) -> list[dict[str, Any]]:
    """`input`: a string (one user turn) or a list of message items whose content is a string or text parts."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "input must be a string or a non-empty list of messages", param="input")
    messages = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") not in ROLES:
            kind = item.get("type") if isinstance(item, dict) else None
            what = f"{kind!r} items are not supported" if isinstance(kind, str) and kind != "message" else (
                f"must be a message with a role among {', '.join(sorted(ROLES))}")
            raise ApiError(400, f"input[{i}] {what}", param="input")
        content = item.get("content")
        if isinstance(content, list):
            parts = []
            for k, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"input[{i}].content[{k}]: {kind!r} parts are not supported (text only)",
                                   param="input")
                parts.append({"type": "text", "text": part["text"]})
            content = parts
        messages.append({"role": item["role"], "content": content})
    return messages


@dataclass
class ResponseShape:
    """The `response` object and its stream events for one request."""

    request: ApiRequest
    request_id: str
    instructions: str | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))
    sequence: int = 0

    @property
    def id(self) -> str:
        return "resp_" + self.request_id

    @property
    def item_id(self) -> str:
        return "msg_" + self.request_id

    def _message(self, text: str, status: str) -> dict[str, Any]:
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": [] if status == "in_progress" else [_text_part(text)]}

    def response(self, done: dict[str, Any] | None) -> dict[str, Any]:
        """The response object: in progress (no output yet) while `done` is None, else finished."""
        params = self.request.params
        body = {"id": self.id, "object": "response", "created_at": self.created_at, "model": self.request.model,
                "status": "in_progress", "output": [], "error": None, "incomplete_details": None,
                "instructions": self.instructions, "max_output_tokens": params["max_tokens"],
                "temperature": params["temperature"], "top_p": params["top_p"], "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}}, "metadata": {},
                "usage": None}
        if done is None:
            return body
        output = done["outputs"][0]
        body["output"] = [self._message(output["text"], "completed")]
        if output["finish_reason"] == "length":
            body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        else:
            body["status"] = "completed"
        usage = done["usage"]
        body["usage"] = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                         "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
                         "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
                         "output_tokens_details": {"reasoning_tokens": 0}}
        return body

    def event(self, kind: str, **fields: Any) -> bytes:
        """One named server-sent event, numbered as OpenAI numbers them."""
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    def opening(self) -> list[bytes]:
        where = {"item_id": self.item_id, "output_index": 0}
        return [self.event("response.created", response=self.response(None)),
                self.event("response.in_progress", response=self.response(None)),
                self.event("response.output_item.added", output_index=0, item=self._message("", "in_progress")),
                self.event("response.content_part.added", **where, content_index=0, part=_text_part(""))]

    def delta(self, text: str) -> bytes:
        return self.event("response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0,
                          delta=text, logprobs=[])

    def closing(self, done: dict[str, Any]) -> list[bytes]:
        text = done["outputs"][0]["text"]
        where = {"item_id": self.item_id, "output_index": 0}
        final = self.response(done)
        return [self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                self.event("response.content_part.done", **where, content_index=0, part=_text_part(text)),
                self.event("response.output_item.done", output_index=0, item=final["output"][0]),
                self.event("response.completed" if final["status"] == "completed" else "response.incomplete",
                           response=final)]

    def failure(self, body: dict[str, Any]) -> bytes:
        return self.event("error", code=body["error"]["code"], message=body["error"]["message"], param=None)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
