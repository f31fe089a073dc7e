"""Fitting a chat conversation into the model's context window (worker side: it needs the tokenizer).

The policy, stated once (the chat page shows it, docs/protocol.md repeats it):

- the reply gets room for `max_tokens`: the rendered prompt plus `max_tokens` must fit `max_model_len`;
- the system prompt and the latest turn (the user message being answered) are always kept;
- when the conversation is too long, whole turns are dropped, oldest first. A turn is a user message with the
  assistant replies that follow it, so the kept transcript still alternates as the chat template expects.
  No message is ever cut in the middle, and nothing is dropped silently: `Fitted.report()` says what went;
- when the system prompt and the latest turn alone leave less than `max_tokens` of room, the reply gets what
  is left (the engine caps it the same way); when they leave none, the request is refused (ValueError) with
  the figures, and nothing is dropped.

Dropping a turn changes the prompt right after the system prompt, so every block after it has a new block
hash: those tokens are computed again, not served from the prefix cache (the cache receipt shows it).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Message = dict[str, str]
POLICY = "keep the system prompt and the latest turns; drop whole turns, oldest first"


@dataclass(frozen=True)
class Fitted:
    """A conversation after fitting: the messages the engine gets, rendered (`prompt_ids`: the engine takes
    these, so a turn goes through the chat template once, not again when it is queued), and what was left out."""

    messages: list[Message]
    prompt_ids: list[int]  # the kept transcript rendered
    window: int  # max_model_len
    max_tokens: int  # the reply's room as asked
    conversation_tokens: int  # the whole transcript rendered, before anything was dropped
    dropped_messages: int  # how many messages after the system prompt were left out (the oldest ones)
    dropped_turns: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def report(self) -> dict[str, Any]:
        """The `context` field of the `done` frame (docs/protocol.md)."""
        return {
            "policy": POLICY,
            "window": self.window,
            "max_tokens": self.max_tokens,
            "reply_room": min(self.max_tokens, self.window - self.prompt_tokens),
            "conversation_tokens": self.conversation_tokens,
            "prompt_tokens": self.prompt_tokens,
            "dropped_messages": self.dropped_messages,
            "dropped_turns": self.dropped_turns,
            "dropped_tokens": self.conversation_tokens - self.prompt_tokens,
        }


def turn_starts(messages: list[Message]) -> list[int]:
    """Index of the first message of each turn after the system prompt (a turn starts at a user message; a
    leading reply without a user message before it is a turn of its own)."""
    first = 1 if messages and messages[0]["role"] == "system" else 0
    return [i for i in range(first, len(messages)) if i == first or messages[i]["role"] == "user"]


def fit_conversation(
    messages: list[Message], max_tokens: int, window: int, encode: Callable[[list[Message]], list[int]]
) -> Fitted:
    """Drop the fewest oldest turns so that the rendered prompt plus `max_tokens` fits `window` tokens.

    `encode` renders messages through the chat template into token ids. The prompt length shrinks as turns
    are dropped, so the fewest turns to drop is found by bisection (a handful of renderings, not one per turn).
    Raises ValueError when even the system prompt and the latest turn leave no room for one reply token.
    """
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    starts = turn_starts(messages)

    def kept(drop: int) -> list[Message]:
        return system + messages[starts[drop]:]

    rendered = encode(messages)
    full = len(rendered)
    if full + max_tokens <= window:
        return Fitted(list(messages), rendered, window, max_tokens, full, 0, 0)
    lowest = len(starts) - 1  # the most turns that may go: all but the latest
    low, high = min(1, lowest), lowest  # the fewest drops that fit lie in [low, high] (high: maybe none fit)
    while low < high:
        middle = (low + high) // 2
        if len(encode(kept(middle))) + max_tokens <= window:
            high = middle
        else:
            low = middle + 1
    drop = low
    prompt = encode(kept(drop))
    if len(prompt) >= window:
        raise ValueError(
            f"the system prompt and the latest message take {len(prompt)} tokens; the context window is {window} "
            "tokens, which must leave room for at least one reply token: shorten them"
        )
    return Fitted(kept(drop), prompt, window, max_tokens, full, starts[drop] - len(system), drop)
