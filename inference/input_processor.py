"""Requests in: tokenise and validate what a caller submits, before the engine's state is touched.

As vLLM V1 keeps its input processing outside the engine core, `InputProcessor` turns a prompt and its
parameters into a `Request` (sequences, adapter, grammar) or refuses it with a clear error, and never
reads or changes the scheduler, the pool or the runner's state: so it is safe from any thread (the web
worker's Celery threads call it while the engine steps), and a refused request leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from inference.beam_search import BeamSearchParams, BeamState
from inference.config import EngineArgs
from inference.lora import LoRAAdapter, LoRAError, LoRARequest
from inference.lora_slots import LoRAManager
from inference.sampling_params import SamplingParams
from inference.sequence import Request
from inference.structured_outputs import StructuredOutputManager


class InputProcessor:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, args: EngineArgs, max_model_len: int,
                 lora: LoRAManager | None, structured: StructuredOutputManager,
                 eos_stop_ids: list[int] | None = None) -> None:
        """`eos_stop_ids`: generation_config.json's EOS ids besides the tokenizer's, stop tokens of every
        request without `ignore_eos` (inference/generation_config.py)."""
        self.tokenizer = tokenizer
        self.eos_stop_ids = eos_stop_ids or []
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len  # the engine's, resolved from the model and the pool
        self.max_num_seqs = args.max_num_seqs
        self.lora = lora
        self.structured = structured

    def make_request(
        self,
        request_id: str,
        prompt: str | dict,
        params: SamplingParams,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> Request:
        """Tokenise and validate a request. A `lora_request`'s adapter is read and checked here (from the
        host cache when it is there); a structured-outputs grammar starts compiling here."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        extra_stops = [] if params.ignore_eos else [t for t in self.eos_stop_ids if t not in params.stop_token_ids]
        if extra_stops:  # a copy: the caller's params may serve other requests (and other engines)
            params = dataclasses.replace(params, stop_token_ids=params.stop_token_ids + extra_stops)
        if isinstance(prompt, str):
            text, token_ids = prompt, encode_text(self.tokenizer, prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, token_ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
        else:
            raise ValueError("a prompt must be a string or a dict with 'prompt_token_ids'")
        if not token_ids:
            raise ValueError("the prompt is empty")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; max_model_len is {self.max_model_len}, "
                "which must leave room for at least one generated token"
            )
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            outside = sorted(t for t in params.logit_bias if t >= self.vocab_size)[:5]
            raise ValueError(f"logit_bias: token id(s) {outside} are out of the vocabulary "
                             f"(ids must be in [0, {self.vocab_size}))")
        if params.n > self.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={self.max_num_seqs}")
        adapter = self._adapter(lora_request)
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.structured.request_grammar(params.structured_outputs)
        return Request(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=token_ids,
            params=params,
            eos_token_id=None if params.ignore_eos else self.tokenizer.eos_token_id,
            cache_salt=cache_salt,
            adapter=adapter,
            arrival_time=arrival_time if arrival_time is not None else time.perf_counter(),
            grammar=grammar,
        )

    def make_beam_request(self, request_id: str, prompt: str | dict, params: BeamSearchParams) -> Request:
        """A beam-search request: `beam_width` seats, its search state started from the prompt (score 0)."""
        request = self.make_request(request_id, prompt, params.sampling_params())
        max_tokens = min(params.max_tokens, self.max_model_len - len(request.prompt_token_ids))
        request.beam = BeamState(params, max_tokens)
        request.beam.scores[request.seqs[0].seq_id] = 0.0
        return request

    def _adapter(self, lora_request: LoRARequest | None) -> LoRAAdapter | None:
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise LoRAError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        if self.lora is None:
            raise LoRAError("this engine was built without LoRA support; pass enable_lora=True")
        return self.lora.get(lora_request)


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool = False) -> list[int]:
    """`tokenizer.encode(text)`'s ids, through the Rust tokenizer's single `encode` where that is the same call.

    Why: transformers encodes one text as a batch, and the Rust batch call lets go of the interpreter lock while
    it runs. Callers serialise on a tokenizer lock (streaming.py), so a thread holding it gave the interpreter
    away and queued behind every other thread to get it back, with all the others queued behind it: 64 chats
    submitted at once spent 33-78 ms each (median) waiting for 0.4 ms of tokenising. The single call keeps the
    interpreter for its fraction of a millisecond. Used only where transformers would not change the Rust
    tokenizer first: no truncation or padding set on it, special tokens not split."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is None or backend.truncation is not None or backend.padding is not None
            or getattr(tokenizer, "split_special_tokens", False) or backend.encode_special_tokens):
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return backend.encode(text, add_special_tokens=add_special_tokens).ids


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The model's own tokenizer and chat template; fails clearly when the folder has none."""
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: cannot load a tokenizer ({exc})") from exc
