"""A model's `generation_config.json`, applied as vLLM applies it (its `--generation-config auto`, the default).

Two things come from it, as in vLLM:
- its `eos_token_id` (one id or a list: Llama 3's instruct models list `<|eot_id|>` beside `<|end_of_text|>`)
  adds stop tokens to every request that does not set `ignore_eos`: each id other than the tokenizer's EOS
  joins the request's `stop_token_ids` (vLLM's `SamplingParams.update_from_generation_config`), so such a
  stop reports the token id as its `stop_reason`;
- its suggested sampling (`temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`, and
  `max_new_tokens` as `max_tokens`: vLLM's `ModelConfig.get_diff_sampling_param`) is used only where the
  request leaves a field unset: `LLM.generate` / `LLM.chat` without sampling params, as vLLM's
  `LLM.get_default_sampling_params`. Explicit `SamplingParams` are used as given, as in vLLM (the fields
  they hold are not "unset").

The file is read with transformers' `GenerationConfig` and only the fields it states count
(`to_diff_dict`), as vLLM reads it. `generation_config="vllm"` ignores the file; a folder path reads that
folder's file instead of the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from inference.sampling_params import SamplingParams

# generation_config.json field -> the SamplingParams field it suggests (vLLM's list).
SUGGESTED = {"repetition_penalty": "repetition_penalty", "temperature": "temperature", "top_k": "top_k",
             "top_p": "top_p", "min_p": "min_p", "max_new_tokens": "max_tokens"}


@dataclass(frozen=True)
class GenerationDefaults:
    """What a model's generation_config.json asks of every request (nothing, for a model without one)."""

    eos_token_ids: frozenset[int] = frozenset()
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams field -> suggested value

    def stop_token_ids(self, tokenizer_eos: int | None) -> list[int]:
        """The extra stop tokens: the file's EOS ids but the tokenizer's own (which stops by itself)."""
        return sorted(self.eos_token_ids - {tokenizer_eos})


def read_generation_config(model_folder: Path, mode: str = "auto") -> GenerationDefaults:
    """`mode`: "auto" reads `model_folder`'s generation_config.json, "vllm" reads none, any other value is a
    folder holding the file. A missing file in the model's folder means no defaults; a named folder without
    one, or a file that does not parse, is a ValueError naming it."""
    if mode == "vllm":
        return GenerationDefaults()
    folder = model_folder if mode == "auto" else Path(mode).expanduser()
    path = folder / "generation_config.json"
    if not path.is_file():
        if mode == "auto":
            return GenerationDefaults()
        raise ValueError(f"generation_config={mode!r}: {path} does not exist")
    try:
        stated = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from exc
    eos = stated.get("eos_token_id")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if not all(isinstance(t, int) and t >= 0 for t in eos_ids):
        raise ValueError(f"{path}: eos_token_id must be a token id or a list of them, got {eos!r}")
    sampling = {ours: stated[theirs] for theirs, ours in SUGGESTED.items() if stated.get(theirs) is not None}
    try:
        SamplingParams(**sampling)  # a suggestion no request could take fails at load, not at every request
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return GenerationDefaults(frozenset(eos_ids), sampling)
