"""OpenAI response bodies and streaming chunks, built from the worker's `done` and `gen.tokens` events.

Chat and completions differ only in names and in where text and logprobs go, so one `Shape` per endpoint
holds those differences and everything else is shared.
"""
import json
import time
from dataclasses import dataclass
from typing import Any

from . import structured
from .schema import ApiRequest

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: list[dict[str, Any]], top: int) -> dict[str, Any]:
    return {
        "content": [
            {"token": e["token"], "logprob": e["logprob"], "bytes": _bytes(e["token"]),
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": _bytes(t["token"])}
                              for t in e["top"][:top]]}
            for e in entries
        ]
    }


def completion_logprobs(entries: list[dict[str, Any]], top: int, offset: int = 0) -> dict[str, Any]:
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top"][:top]} for e in entries],
        "text_offset": offsets,
    }


def usage(done_usage: dict[str, int], receipt: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `cache_receipt` (our extension, docs/api.md) says where the prompt's K/V came
    from and where the time went."""
    prompt, completion = done_usage["prompt_tokens"], done_usage["completion_tokens"]
    figures = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": done_usage["cached_tokens"]},
    }
    if receipt is not None:
        figures["cache_receipt"] = receipt
    return figures


@dataclass
class Shape:
    """How one endpoint names things: object types, the id prefix, and where text and logprobs go."""

    chat: bool
    request: ApiRequest
    request_id: str

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + self.request_id
        self.created = int(time.time())

    def _envelope(self, object_type: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": object_type, "created": self.created, "model": self.request.model,
                "system_fingerprint": None, "choices": choices}

    def _logprobs(self, output: dict[str, Any]) -> dict[str, Any] | None:
        if self.request.top_logprobs is None or "logprobs" not in output:
            return None
        if self.chat:
            return chat_logprobs(output["logprobs"], self.request.top_logprobs)
        return completion_logprobs(output["logprobs"], self.request.top_logprobs, len(self.echo(output["index"])))

    def echo(self, index: int) -> str:
        """The text choice `index` starts with (its prompt, with `echo`), before anything generated."""
        return self.request.echo[index // self.request.params["n"]] if self.request.echo else ""

    @property
    def num_choices(self) -> int:
        return self.request.params["n"] * max(1, len(self.request.echo))

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether the request asked for prompt_logprobs: then, as vLLM's server, a completion choice carries its
        prompt's (a list: None for the first token, then {token id: {logprob, rank, decoded_token}}), and a
        chat response its one prompt's, beside the choices. Not in streams (vLLM refuses them there)."""
        return self.request.params.get("prompt_logprobs") is not None

    # --- whole responses ---------------------------------------------------------------------------
    def completion(self, done: dict[str, Any]) -> dict[str, Any]:
        choices = []
        for output in done["outputs"]:
            choice: dict[str, Any] = {"index": output["index"]}
            reason = FINISH_REASONS.get(output["finish_reason"], output["finish_reason"])
            if self.chat:
                choice["message"], reason = structured.reply(self.request.structured, output["text"], reason)
                if self.echo(output["index"]) and isinstance(choice["message"].get("content"), str):
                    choice["message"]["content"] = self.echo(output["index"]) + choice["message"]["content"]
            else:
                choice["text"] = self.echo(output["index"]) + output["text"]
            choice["logprobs"] = self._logprobs(output)
            choice["finish_reason"] = reason
            if self.wants_prompt_logprobs and not self.chat:
                choice["prompt_logprobs"] = output.get("prompt_logprobs")
            choices.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        if self.wants_prompt_logprobs and self.chat:  # vLLM puts a chat's beside its choices (one prompt)
            body["prompt_logprobs"] = done["outputs"][0].get("prompt_logprobs") if done["outputs"] else None
        body["usage"] = usage(done["usage"], done.get("receipt"))
        return body

    # --- streaming chunks --------------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, finish_reason: str | None = None,
              logprobs: dict[str, Any] | None = None, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = logprobs
        choice["finish_reason"] = FINISH_REASONS.get(finish_reason, finish_reason)
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice])

    @property
    def streams_text(self) -> bool:
        """False for replies that may be tool calls: their JSON text is sent whole in the closing chunk."""
        return self.request.structured is None or not self.request.structured.tool_replies

    def first_chunks(self) -> list[dict[str, Any]]:
        """Chat streams open each choice with the assistant role, as OpenAI's do; an echoed text comes first."""
        if self.chat:
            return [self.chunk(i, self.echo(i), role=True) for i in range(self.num_choices)]
        return [self.chunk(i, self.echo(i)) for i in range(self.num_choices) if self.echo(i)]

    def final_chunks(self, done: dict[str, Any], sent: dict[int, str]) -> list[dict[str, Any]]:
        """One closing chunk per choice: any text the deltas missed, its logprobs, the finish reason. (The
        logprobs of a whole choice travel here; clients concatenate them across chunks, so it adds up.)"""
        chunks = []
        for output in done["outputs"]:
            if not self.streams_text:
                chunks.append(self._reply_chunk(output))
                continue
            already = sent.get(output["index"], "")
            rest = output["text"][len(already):] if output["text"].startswith(already) else ""
            chunks.append(self.chunk(output["index"], rest, output["finish_reason"], self._logprobs(output)))
        return chunks

    def _reply_chunk(self, output: dict[str, Any]) -> dict[str, Any]:
        """A whole reply as one closing chunk: its content, or its tool calls (with their index)."""
        reason = FINISH_REASONS.get(output["finish_reason"], output["finish_reason"])
        message, reason = structured.reply(self.request.structured, output["text"], reason)
        chunk = self.chunk(output["index"], message["content"], reason, self._logprobs(output))
        if "tool_calls" in message:
            chunk["choices"][0]["delta"]["tool_calls"] = [{"index": i, **call}
                                                          for i, call in enumerate(message["tool_calls"])]
        return chunk

    def usage_chunk(self, done: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(done["usage"], done.get("receipt"))
        return body


class RunningUsage:
    """vLLM's `stream_options.continuous_usage_stats`: every chunk carries its choice's usage so far, the
    prompt's tokens (the choice's own prompt, in a batch) and the tokens that choice has generated (vLLM counts
    per choice, so with n > 1 each choice's chunks count its own tokens). Fed by the request's updates: the
    counts the worker streams with the text, then the `done`'s exact figures."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.prompt: dict[int, int] = {}  # per prompt of the batch
        self.completion: dict[int, int] = {}  # per choice

    def start(self, k: int, first: Any) -> None:
        """Prompt k's length from its first update, for the opening chunks (nothing generated yet: vLLM's 0)."""
        prompt = first.prompt_tokens if first.done is None else first.done["usage"]["prompt_tokens"]
        if prompt is not None:
            self.prompt[k] = prompt

    def update(self, k: int, update: Any) -> None:
        """Prompt k's update (a lifecycle.Update: `prompt_tokens`, per-sample `tokens`, `done`)."""
        self.start(k, update)
        for i, count in update.tokens.items():
            self.completion[k * self.n + i] = count
        if update.done is not None:
            for output in update.done["outputs"]:
                index = k * self.n + output["index"]
                self.completion[index] = output.get("completion_tokens", self.completion.get(index, 0))

    def stamp(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """The chunk (of one choice) with that choice's usage so far."""
        index = chunk["choices"][0]["index"]
        prompt, completion = self.prompt.get(index // self.n, 0), self.completion.get(index, 0)
        chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return chunk


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
