"""The edge: raw client input (a websocket text frame, an API body) into a JSON object, or a clear refusal.

Every front door (the chat and demo sockets, the OpenAI API) parses through `parse_json_object`, so the
same rules hold everywhere, in this order, each before the next step could be hurt by the input:
1. size: at most `max_bytes` (UTF-8) — checked before anything is parsed;
2. nesting: at most `max_depth` levels of arrays and objects, counted by a scan that skips strings, before
   `json.loads` (whose recursion 50,000 nested `[` would exhaust: a RecursionError, not a ValueError);
3. JSON syntax, and an object at the top;
4. text: no unpaired UTF-16 surrogate (`"\\ud800"` decodes to one; the tokenizer, SQLite and UTF-8 encoders
   refuse it) and no NUL (PostgreSQL refuses it), in any key or value, named by its path. The OpenAI API takes
   NUL (`allow_nul`): nothing of an API request is stored, SmolLM2's vocabulary has a token for it, and vLLM's
   server takes it (its random benchmark dataset sends it).
Anything refused raises `InvalidInput` (or `TooLarge`), whose message is safe to show to that client.
"""
from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from typing import Any


# Websocket close codes of every socket (docs/protocol.md), served to the pages with their configuration.
CLOSE_CODES = {
    "message_too_big": 1009,  # a frame over the server's hard cap (daphne's, twice max_frame_bytes)
    "login_required": 4401,
    "forbidden": 4403,
}


class InvalidInput(ValueError):
    """A client sent something we refuse; the message is safe and meant to be shown to that client."""


class TooLarge(InvalidInput):
    """The input is over its size cap (HTTP 413 on the API)."""


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON `text` (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def check_text(value: Any, path: str = "", allow_nul: bool = False) -> None:
    """Refuse unpaired surrogates, and NUL characters unless `allow_nul`, anywhere in a parsed JSON value (keys
    included)."""
    if isinstance(value, str):
        _check_string(value, path or "the input", allow_nul)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_string(key, f"a field name in {path or 'the input'}", allow_nul)
            check_text(item, f"{path}.{key}" if path else key, allow_nul)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_text(item, f"{path}[{i}]", allow_nul)


def _check_string(text: str, where: str, allow_nul: bool) -> None:
    found = (_SURROGATE if allow_nul else _BAD_TEXT).search(text)
    if found:
        what = "a NUL character" if found.group() == "\x00" else "an unpaired surrogate (invalid Unicode)"
        raise InvalidInput(f"{where} contains {what}; send valid Unicode text")


def parse_json_object(raw: str | bytes, max_bytes: int, max_depth: int, what: str = "frame",
                      allow_nul: bool = False) -> dict[str, Any]:
    """Parse one client input (`what` names it in messages: "frame", "the request body") by the rules above."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TooLarge(f"{what} larger than {max_bytes} bytes")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{what} is not valid UTF-8") from None
    if nesting_depth(raw) > max_depth:
        raise InvalidInput(f"{what} nests arrays and objects deeper than {max_depth} levels")
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidInput(f"{what} is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    check_text(value, allow_nul=allow_nul)
    return value


def decode_frame(text: str | None, limits: Mapping[str, int]) -> dict[str, Any]:
    """One websocket text frame into a JSON object (`limits`: PLAYGROUND_LIMITS); binary frames are refused."""
    if text is None:
        raise InvalidInput("only JSON text frames are accepted")
    return parse_json_object(text, limits["max_frame_bytes"], limits["max_json_depth"])
