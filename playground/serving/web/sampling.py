"""The sampling fields clients may set, and their ranges: the one table every web-side rule comes from.

`FIELDS` is that table. From it come the validation of the chat socket's `params` and of the OpenAI API's
sampling fields (`validate_sampling`), the defaults (`defaults`, `api_defaults`), and the page's controls
(`page_specs`, served in the chat page's config: the page keeps no copy; with each field's API spelling, for the
page's "View code"). The server caps of `PLAYGROUND_LIMITS` (max_tokens, max_n, max_stop, max_stop_length)
replace a field's upper bound where the table names one. The web process cannot import the engine (it never
loads torch), so the ranges are written here; they lie within what `inference.SamplingParams` accepts (a test
checks every bound against it). The result of validation is a plain dict of SamplingParams keyword arguments
that travels in the Celery task.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .edge import InvalidInput

MAX_SEED = 2**53 - 1  # the largest integer a browser's Number holds exactly


@dataclass(frozen=True)
class Field:
    """One sampling field: its type (`kind`), accepted range and default, and how the page shows it.

    kind "number": a finite number in [low, high] ((low, high] when `low_open`); "integer": an integer in
    [low, high]; "optional-integer": null or an integer in [low, high]; "strings": a string or a list of at
    most `high` strings of 1..`max_stop_length` characters. `cap` names the PLAYGROUND_LIMITS entry that is
    `high`. `control` is the page's widget: "range" (slider and box), "int", "optional-int", "lines", or
    "toggle" (a checkbox: checked sends `on`, unchecked leaves the field out, so it keeps its default).

    How the OpenAI API spells the field, for the page's "View code" (the equivalent API request): by default an
    OpenAI parameter of the same name; `vllm_extra`: one of vLLM's extra parameters, which the `openai` client
    passes in `extra_body`; `api_name`: the API's name for it where the API's own field of this name means
    something else (chat's `logprobs` is a boolean, beside `top_logprobs`), `api_with` the fields the API needs
    beside it. A field with an `api_name` is not read from API bodies (`API_NAMES`): playground/api/schema.py
    reads the API's own.
    """

    name: str
    kind: str
    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    cap: str | None = None
    label: str = ""
    control: str = "int"
    step: float | None = None
    help: str = ""
    advanced: bool = False
    on: Any = None
    vllm_extra: bool = False
    api_name: str | None = None
    api_with: tuple[tuple[str, Any], ...] = ()


FIELDS: tuple[Field, ...] = (
    Field("temperature", "number", 0.7, 0.0, 2.0, label="Temperature", control="range", step=0.05,
          help="0 is greedy decoding"),
    Field("top_p", "number", 1.0, 0.0, 1.0, low_open=True, label="Top p", control="range", step=0.01),
    Field("top_k", "integer", 0, -1, 100_000, label="Top k", help="0 or -1 turns it off", vllm_extra=True),
    Field("max_tokens", "integer", 256, 1, cap="max_tokens", label="Max tokens"),
    Field("n", "integer", 1, 1, cap="max_n", label="Samples (n)", help="shown side by side"),
    # 20: the engine's SamplingParams.MAX_LOGPROBS; the page's toggle asks for the top 5
    Field("logprobs", "optional-integer", None, 0, 20, label="Token probabilities", control="toggle", on=5,
          help="each token's top 5 alternatives: the reply's Tokens button shows them",
          api_name="top_logprobs", api_with=(("logprobs", True),)),
    Field("min_p", "number", 0.0, 0.0, 1.0, label="Min p", control="range", step=0.01, advanced=True,
          help="drops tokens below this share of the top token's probability", vllm_extra=True),
    Field("presence_penalty", "number", 0.0, -2.0, 2.0, label="Presence penalty", control="range", step=0.1,
          advanced=True),
    Field("frequency_penalty", "number", 0.0, -2.0, 2.0, label="Frequency penalty", control="range", step=0.1,
          advanced=True),
    Field("repetition_penalty", "number", 1.0, 0.0, 2.0, low_open=True, label="Repetition penalty",
          control="range", step=0.05, advanced=True, vllm_extra=True),
    Field("seed", "optional-integer", None, 0, MAX_SEED, label="Seed", control="optional-int", advanced=True,
          help="blank for a random seed"),
    Field("stop", "strings", [], cap="max_stop", label="Stop sequences", control="lines", advanced=True,
          help="one per line; write \\n for a newline"),
)
NAMES = frozenset(f.name for f in FIELDS)  # what the chat socket's `params` may hold
API_NAMES = frozenset(f.name for f in FIELDS if f.api_name is None)  # what API bodies carry under these names

# What OpenAI's API does where the playground differs (docs/api.md): temperature 1, 16 tokens for completions.
API_DEFAULTS = {"temperature": 1.0}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _high(spec: Field, limits: Mapping[str, int]) -> float:
    return limits[spec.cap] if spec.cap else spec.high


def defaults(limits: Mapping[str, int]) -> dict[str, Any]:
    """The playground's default of every field (a default above its cap is lowered to the cap)."""
    return {f.name: min(f.default, _high(f, limits)) if f.kind == "integer" else f.default for f in FIELDS}


def api_defaults(chat: bool, limits: Mapping[str, int], suggested: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAI API's defaults: the model's generation_config.json suggestions where it makes them (vLLM's
    server does the same), else OpenAI's where it has them, else the playground's; each within its caps."""
    values = {**defaults(limits), **API_DEFAULTS}
    if not chat:
        values["max_tokens"] = min(COMPLETIONS_DEFAULT_MAX_TOKENS, limits["max_tokens"])
    by_name = {f.name: f for f in FIELDS}
    for name, value in (suggested or {}).items():
        field = by_name.get(name)
        if field is not None and field.kind in ("number", "integer"):  # what generation_config.json suggests
            values[name] = max(field.low, min(value, _high(field, limits)))
    return values


def page_specs(limits: Mapping[str, int]) -> list[dict[str, Any]]:
    """The page's controls, caps applied (static/chat/params.js builds its form from these), each with how the
    OpenAI chat API spells it and its default there (static/chat/viewcode.js writes the equivalent request)."""
    base, api = defaults(limits), api_defaults(True, limits)
    return [
        {"name": f.name, "label": f.label, "kind": f.control, "min": f.low, "max": _high(f, limits),
         "min_open": f.low_open, "step": f.step, "value": base[f.name], "help": f.help, "advanced": f.advanced,
         "api": {"name": f.api_name or f.name, "default": api[f.name], "with": dict(f.api_with),
                 "vllm_extra": f.vllm_extra},
         **({"max_length": limits["max_stop_length"]} if f.kind == "strings" else {}),
         **({"on": f.on} if f.control == "toggle" else {})}
        for f in FIELDS
    ]


def _check(spec: Field, value: Any, limits: Mapping[str, int]) -> Any:
    name, low, high = f"params.{spec.name}", spec.low, _high(spec, limits)
    if spec.kind == "strings":
        return _strings(value, name, int(high), limits["max_stop_length"])
    if spec.kind == "optional-integer" and value is None:
        return None
    wanted = {"number": "a number", "integer": "an integer", "optional-integer": "an integer or null"}[spec.kind]
    typed = spec.kind == "number" or isinstance(value, int)  # integer kinds take ints only
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not typed:
        raise InvalidInput(f"{name} must be {wanted}")
    if isinstance(value, float) and not math.isfinite(value) or value < low or value > high or (spec.low_open and value == low):
        bracket = "(" if spec.low_open else "["
        raise InvalidInput(f"{name} must be in {bracket}{low}, {high}], got {value}")
    return float(value) if spec.kind == "number" else value


def _strings(value: Any, name: str, most: int, max_length: int) -> list[str]:
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise InvalidInput(f"{name} must be a string or a list of strings")
    if len(strings) > most:
        raise InvalidInput(f"{name} allows at most {most} sequences")
    if any(not s or len(s) > max_length for s in strings):
        raise InvalidInput(f"{name} sequences must have 1 to {max_length} characters")
    return strings


def validate_sampling(params: Any, base: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, Any]:
    """Complete SamplingParams kwargs from client `params` over the defaults `base`; raises InvalidInput
    naming the field (as `params.<name>`)."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidInput("params must be an object")
    unknown = sorted(set(params) - NAMES)
    if unknown:
        raise InvalidInput(f"unknown field(s) in params: {', '.join(unknown)}")
    merged = {**base, **params}
    return {spec.name: _check(spec, merged[spec.name], limits) for spec in FIELDS}
