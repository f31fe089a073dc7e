"""The vLLM-compatible offline API: `LLM(...).generate(prompts, sampling_params)` and `.chat(...)`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq

from tqdm import tqdm

from inference.beam_search import BeamSearchParams
from inference.config import EngineArgs
from inference.engine import LLMEngine
from inference.input_processor import encode_text
from inference.lora import LoRARequest
from inference.outputs import RequestOutput
from inference.sampling_params import SamplingParams

Prompt = str | dict
Messages = list[dict]


class LLM:
    """Offline batch inference. Keyword arguments are those of `EngineArgs` (same names as vLLM).

    With `tensor_parallel_size=N` the engine runs N - 1 rank processes beside this one; `close()` (or leaving
    a `with LLM(...) as llm:` block, or dropping the object, or the interpreter's exit) stops them.
    """

    def __init__(self, model: str | None = None, **kwargs) -> None:
        if model is not None:
            kwargs["model"] = model
        unknown = set(kwargs) - set(EngineArgs.__dataclass_fields__)
        if unknown:
            raise TypeError(f"LLM() got unknown arguments: {', '.join(sorted(unknown))}")
        self.llm_engine = LLMEngine(EngineArgs(**kwargs))
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel rank processes (idempotent); the LLM cannot generate after it."""
        self.llm_engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if "llm_engine" in self.__dict__:  # not when the constructor failed (it closed what it started)
            self.close()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What a prompt without sampling params runs with, as in vLLM: SamplingParams' defaults, with the
        fields the model's generation_config.json suggests (inference/generation_config.py) in their place."""
        return SamplingParams(**self.llm_engine.generation.sampling)

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion in one continuous batch; outputs come back in input order.

        Without `sampling_params`, `get_default_sampling_params()` (the model's suggested sampling).
        `lora_request`: one adapter for every prompt, or a list with one per prompt (None: the base model).
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        params = self._per_prompt(sampling_params, SamplingParams, self.get_default_sampling_params(), len(prompts),
                                  "sampling params")
        loras = self._per_prompt(lora_request, LoRARequest, None, len(prompts), "LoRA requests")
        engine = self.llm_engine
        # Validate everything before queueing anything, so a bad prompt leaves no half-submitted batch.
        requests = [
            engine.make_request(str(next(self._ids)), prompt, p, lora_request=lora)
            for prompt, p, lora in zip(prompts, params, loras)
        ]
        for request in requests:
            engine.add(request)
        return self._run([r.request_id for r in requests], use_tqdm)

    def chat(
        self,
        messages: Messages | Seq[Messages],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [
            {"prompt_token_ids": ids, "prompt": None}
            for ids in (self.encode_chat(c, add_generation_prompt) for c in conversations)
        ]
        return self.generate(prompts, sampling_params, use_tqdm, lora_request)

    def beam_search(
        self, prompts: Prompt | Seq[Prompt], params: BeamSearchParams, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Beam search for every prompt in one continuous batch (see inference.beam_search).

        Each output's `.outputs` holds the `beam_width` best hypotheses, best first, with their
        length-penalised score in `cumulative_logprob`.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        # Validate everything before queueing anything, as generate() does.
        requests = [self.llm_engine.make_beam_request(str(next(self._ids)), p, params) for p in prompts]
        for request in requests:
            self.llm_engine.add(request)
        return self._run([r.request_id for r in requests], use_tqdm)

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        return encode_chat(self.llm_engine.tokenizer, messages, add_generation_prompt)

    def metrics(self) -> dict:
        return self.llm_engine.metrics()

    def reset_prefix_cache(self) -> int:
        return self.llm_engine.reset_prefix_cache()

    @staticmethod
    def _per_prompt(value: object, kind: type, default: object, count: int, what: str) -> list:
        """One `kind` (or None: `default`) for every prompt, or a list with exactly one per prompt."""
        if value is None:
            return [default] * count
        if isinstance(value, kind):
            return [value] * count
        values = list(value)
        if len(values) != count:
            raise ValueError(f"got {len(values)} {what} for {count} prompts")
        return values

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        """Step until every request has finished; if a step raises, the unfinished ones are aborted (their
        blocks freed) before the error propagates."""
        engine = self.llm_engine
        pending = set(request_ids)
        finished: dict[str, RequestOutput] = {}
        try:
            with tqdm(total=len(request_ids), desc="generate", disable=not use_tqdm or None) as bar:
                while pending:
                    for output in engine.step():
                        if output.finished and output.request_id in pending:
                            finished[output.request_id] = output
                            pending.discard(output.request_id)
                            bar.update(1)
        except BaseException:
            for request_id in pending:
                engine.abort_request(request_id)
            raise
        return [finished[r] for r in request_ids]


def encode_chat(tokenizer, messages: Messages, add_generation_prompt: bool = True, continue_final_message: bool = False,
                **template_kwargs: object) -> list[int]:
    """Token ids of a conversation rendered through the model's chat template. `continue_final_message`
    leaves the last message open (no end-of-turn), so generation continues it (vLLM's assistant prefill);
    `template_kwargs` are extra variables for the template (vLLM's `chat_template_kwargs`)."""
    if not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    if tokenizer.chat_template is None:
        raise ValueError("this model has no chat template; use generate() with a plain prompt")
    if add_generation_prompt and continue_final_message:
        raise ValueError("add_generation_prompt and continue_final_message cannot both be true")
    # Rendered, then tokenised as apply_chat_template(tokenize=True) does (no special tokens added).
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                         continue_final_message=continue_final_message, **template_kwargs)
    return encode_text(tokenizer, text)
