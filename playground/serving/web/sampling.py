"""The sampling fields clients may set, and their ranges: the one table every web-side rule comes from.

`FIELDS` is that table. From it come the validation of the chat socket's `params` and of the OpenAI API's
sampling fields (`validate_sampling`), the defaults (`defaults`, `api_defaults`), and the page's controls
(`page_specs`, served in the chat page's config: the page keeps no copy). The server caps of
`PLAYGROUND_LIMITS` (max_tokens, max_n, max_stop, max_stop_length) replace a field's upper bound where the
table names one. The web process cannot import the engine (it never loads torch), so the ranges are written
here; they lie within what `inference.SamplingParams` accepts (a test checks every bound against it). The
result of validation is a plain dict of SamplingParams keyword arguments that travels in the Celery task.
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
    [low, high]; "seed": null or an integer in [low, high]; "strings": a string or a list of at most `high`
    strings of 1..`max_stop_length` characters. `cap` names the PLAYGROUND_LIMITS entry that is `high`.
    `control` is the page's widget: "range" (slider and box), "int", "optional-int" or "lines".
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


FIELDS: tuple[Field, ...] = (
    Field("temperature", "number", 0.7, 0.0, 2.0, label="Temperature", control="range", step=0.05,
          help="0 is greedy decoding"),
    Field("top_p", "number", 1.0, 0.0, 1.0, low_open=True, label="Top p", control="range", step=0.01),
    Field("top_k", "integer", 0, -1, 100_000, label="Top k", help="0 or -1 turns it off"),
    Field("max_tokens", "integer", 256, 1, cap="max_tokens", label="Max tokens"),
    Field("n", "integer", 1, 1, cap="max_n", label="Samples (n)", help="shown side by side"),
    Field("min_p", "number", 0.0, 0.0, 1.0, label="Min p", control="range", step=0.01, advanced=True,
          help="drops tokens below this share of the top token's probability"),
    Field("presence_penalty", "number", 0.0, -2.0, 2.0, label="Presence penalty", control="range", step=0.1,
          advanced=True),
    Field("frequency_penalty", "number", 0.0, -2.0, 2.0, label="Frequency penalty", control="range", step=0.1,
          advanced=True),
    Field("repetition_penalty", "number", 1.0, 0.0, 2.0, low_open=True, label="Repetition penalty",
          control="range", step=0.05, advanced=True),
    Field("seed", "seed", None, 0, MAX_SEED, label="Seed", control="optional-int", advanced=True,
          help="blank for a random seed"),
    Field("stop", "strings", [], cap="max_stop", label="Stop sequences", control="lines", advanced=True,
          help="one per line; write \\n for a newline"),
)
NAMES = frozenset(f.name for f in FIELDS)

# What OpenAI's API does where the playground differs (docs/api.md): temperature 1, 16 tokens for completions.
API_DEFAULTS = {"temperature": 1.0}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _high(spec: Field, limits: Mapping[str, int]) -> float:
    return limits[spec.cap] if spec.cap else spec.high


def defaults(limits: Mapping[str, int]) -> dict[str, Any]:
    """The playground's default of every field (a default above its cap is lowered to the cap)."""
    return {f.name: min(f.default, _high(f, limits)) if f.kind == "integer" else f.default for f in FIELDS}


def api_defaults(chat: bool, limits: Mapping[str, int]) -> dict[str, Any]:
    """The OpenAI API's defaults: OpenAI's where it has them, the playground's elsewhere."""
    values = {**defaults(limits), **API_DEFAULTS}
    if not chat:
        values["max_tokens"] = min(COMPLETIONS_DEFAULT_MAX_TOKENS, limits["max_tokens"])
    return values


def page_specs(limits: Mapping[str, int]) -> list[dict[str, Any]]:
    """The page's controls, caps applied (static/chat/params.js builds its form from these)."""
    base = defaults(limits)
    return [
        {"name": f.name, "label": f.label, "kind": f.control, "min": f.low, "max": _high(f, limits),
         "min_open": f.low_open, "step": f.step, "value": base[f.name], "help": f.help, "advanced": f.advanced,
         **({"max_length": limits["max_stop_length"]} if f.kind == "strings" else {})}
        for f in FIELDS
    ]


def _check(spec: Field, value: Any, limits: Mapping[str, int]) -> Any:
    name, low, high = f"params.{spec.name}", spec.low, _high(spec, limits)
    if spec.kind == "strings":
        return _strings(value, name, int(high), limits["max_stop_length"])
    if spec.kind == "seed" and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{name} must be a {'number' if spec.kind == 'number' else 'integer'}")
    if spec.kind != "number" and not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer")
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
