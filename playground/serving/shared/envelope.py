"""The one request envelope: what a generation asks of a worker, from the web lifecycle through Celery to the
engine service.

Every front door (the chat socket, the OpenAI API, the demo) builds a `Job`; `dispatch.submit` sends it as
the Celery task's JSON (`to_task`), and the worker rebuilds it (`from_task`) and hands it to
`EngineService.submit`. A new field is added here once and travels the whole way; no signature on the path
spells the fields out. Plain data only (no torch, no Django), so both sides import it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

KINDS = ("generate", "tokenize", "detokenize")  # what a Job asks of the worker (Job.kind)
Message = dict[str, Any]  # {"role", "content", and optionally "name", "tool_call_id"}


@dataclass(frozen=True)
class Job:
    """One generation: a chat transcript (`messages`) or a `prompt` (text, or token ids), with
    SamplingParams kwargs.

    `add_generation_prompt`, `continue_final_message` and `chat_template_kwargs` are how the transcript is
    rendered through the chat template (vLLM's meanings: `continue_final_message` makes the last, assistant,
    message an unfinished prefix the reply continues). `truncate_prompt_tokens` keeps only the prompt's last
    that many tokens. `fit_window` (the chat page) drops whole oldest turns that do not fit the context window
instead of refusing (worker/context_window.py). `preferred_worker` only routes the task (the worker that served the conversation's
    last turn) and is not sent.

    `kind` says what the worker does with it: "generate" (the engine runs it), or, for vLLM's /tokenize and
    /detokenize, "tokenize" (the prompt's or the transcript's token ids, through the same tokenizer and chat
    template a generation uses; `add_special_tokens` and `return_token_strs` as vLLM's) and "detokenize" (the
    text of `prompt`'s token ids). Those two never reach the engine's scheduler: no sequence, no KV block."""

    params: dict[str, Any]
    messages: list[Message] | None = None
    prompt: str | list[int] | None = None
    cache_salt: str | None = None
    preferred_worker: str = ""
    adapter: str | None = None  # a LoRA adapter of PLAYGROUND_LORA_MODULES; None: the base model
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    truncate_prompt_tokens: int | None = None
    fit_window: bool = False  # drop the oldest turns that do not fit the window (the chat page), not refuse
    paced: bool = False  # the chat page: its text may wait longer between events while many stream (coalesce.py)
    kind: str = "generate"  # or "tokenize" / "detokenize" (KINDS)
    add_special_tokens: bool = False  # tokenize a text prompt with the tokenizer's special tokens (BOS...)
    return_token_strs: bool = False  # tokenize: also each token's string
    # The channel the worker sends this request's events to: its web process's inbox (web/inbox.py), set
    # when the request starts listening.
    reply_to: str = ""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a Job needs exactly one of messages and prompt")
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be true")
        if self.kind not in KINDS:
            raise ValueError(f"unknown job kind {self.kind!r}")
        if self.kind == "detokenize" and not isinstance(self.prompt, list):
            raise ValueError("a detokenize job's prompt is a list of token ids")

    def to_task(self) -> dict[str, Any]:
        """The JSON-ready form the Celery task carries (without the routing-only `preferred_worker`)."""
        data = asdict(self)
        del data["preferred_worker"]
        return data

    @classmethod
    def from_task(cls, data: dict[str, Any]) -> Job:
        """The Job a worker received; raises ValueError on a field it does not know (a newer web side)."""
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown job field(s): {', '.join(sorted(unknown))}")
        return cls(**data)
