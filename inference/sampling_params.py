"""Per-request sampling settings, validated up front so a bad value fails its own request only."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class StructuredOutputsParams:
    """One constraint on a request's output, in vLLM's shape; exactly one field is set.

    `json`: a JSON schema (dict or JSON text); `regex`: a regular expression the whole output matches;
    `choice`: the output is exactly one of these strings; `grammar`: an EBNF grammar (xgrammar's dialect,
    rule `root`); `json_object`: any JSON object; `structural_tag`: an xgrammar structural tag (dict or
    JSON text), e.g. free text or a JSON tool call. Only the shape is checked here; whether the schema or
    grammar compiles is checked by `inference.structured_outputs` when the engine takes the request.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict | None = None

    def __post_init__(self) -> None:
        chosen = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(chosen) != 1:
            raise ValueError("StructuredOutputsParams needs exactly one of json, regex, choice, grammar, "
                             f"json_object, structural_tag; got {', '.join(chosen) or 'none'}")
        kind = chosen[0]
        value = getattr(self, kind)
        if kind in ("json", "structural_tag") and not isinstance(value, (str, dict)):
            raise ValueError(f"StructuredOutputsParams.{kind} must be a dict or JSON text, got {type(value).__name__}")
        if kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
            raise ValueError(f"StructuredOutputsParams.{kind} must be a non-empty string")
        if kind == "choice" and (not isinstance(value, list) or not value
                                 or not all(isinstance(c, str) and c for c in value)):
            raise ValueError("StructuredOutputsParams.choice must be a non-empty list of non-empty strings")
        if kind == "json_object" and value is not True:
            raise ValueError("StructuredOutputsParams.json_object must be True when given")

    @property
    def kind(self) -> str:
        """The name of the one field that is set."""
        return next(f.name for f in fields(self) if getattr(self, f.name) not in (None, False))


@dataclass
class SamplingParams:
    """How to turn each step's logits into tokens, and when to stop; field names follow vLLM.

    `temperature == 0` means greedy. `top_k` of 0 or -1 and `top_p == 1` disable those filters.
    `logprobs=k` returns, per generated token, the k most likely tokens' log-probabilities (plus the
    sampled one's) computed from the raw model logits, as vLLM does.
    `prompt_logprobs=k` returns, per prompt token after the first, its log-probability and the k most likely
    tokens' at that position (`RequestOutput.prompt_logprobs`); such a request reads nothing from the prefix
    cache, as in vLLM, since every prompt position's logits must be computed.
    `logit_bias` maps token ids to a bias added to their logits before penalties, temperature and the filters
    (greedy included), after the logprobs are taken; each bias is clamped to [-100, 100] as OpenAI does, and
    keys may be integer strings (JSON's keys). The engine refuses ids outside the vocabulary.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    # A grammar the output must follow (inference.structured_outputs); a dict is taken as its fields,
    # which is how the params travel from the web process to a worker.
    structured_outputs: StructuredOutputsParams | dict[str, Any] | None = None
    stop_strings: tuple[str, ...] = field(init=False, repr=False)

    MAX_LOGPROBS = 20

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or self.n < 1:
            fail("n", "must be an integer >= 1")
        if not _is_number(self.temperature) or self.temperature < 0:
            fail("temperature", "must be a number >= 0")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            fail("top_k", "must be -1, 0 (disabled) or a positive integer")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            fail("min_p", "must be in [0, 1]")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            fail("repetition_penalty", "must be > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_number(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                fail(name, "must be in [-2, 2]")
        if self.seed is not None and not isinstance(self.seed, int):
            fail("seed", "must be an integer or None")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            fail("max_tokens", "must be an integer >= 1 or None")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            fail("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens", f"must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= self.MAX_LOGPROBS
        ):
            fail("logprobs", f"must be an integer in [0, {self.MAX_LOGPROBS}] or None")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or isinstance(self.prompt_logprobs, bool)
            or not 0 <= self.prompt_logprobs <= self.MAX_LOGPROBS
        ):
            fail("prompt_logprobs", f"must be an integer in [0, {self.MAX_LOGPROBS}] or None")
        if self.logit_bias is not None:
            self.logit_bias = self._clamped_bias(fail)
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if not all(isinstance(s, str) and s for s in stops):
            fail("stop", "must be a non-empty string or a list of non-empty strings")
        self.stop_strings = tuple(stops)
        ids = self.stop_token_ids or []
        if not all(isinstance(t, int) and t >= 0 for t in ids):
            fail("stop_token_ids", "must be a list of non-negative integers")
        self.stop_token_ids = list(ids)
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.structured_outputs, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
            except TypeError as exc:  # an unknown field
                raise ValueError(f"SamplingParams.structured_outputs: {exc}") from exc
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                    StructuredOutputsParams):
            fail("structured_outputs", "must be a StructuredOutputsParams, a dict of its fields or None")

    def _clamped_bias(self, fail: Callable[[str, str], None]) -> dict[int, float] | None:
        """`logit_bias` with int keys (an integer string is taken, as JSON keys are strings) and each bias
        clamped to [-100, 100]; an empty mapping is no bias (None), so batches skip the work."""
        if not isinstance(self.logit_bias, dict):
            fail("logit_bias", "must be a dict of token id -> bias")
        bias = {}
        for token, value in self.logit_bias.items():
            if isinstance(token, str) and re.fullmatch(r"-?[0-9]+", token.strip()):
                token = int(token)
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                fail("logit_bias", f"keys must be non-negative token ids (integers or integer strings): {token!r}")
            if not _is_number(value) or math.isinf(value):
                fail("logit_bias", f"values must be finite numbers: {value!r} for token {token}")
            bias[token] = min(100.0, max(-100.0, float(value)))
        return bias or None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
