"""Validation of sampling parameters sent by clients, before anything reaches a worker.

The web process cannot import the engine (it never loads torch), so the accepted ranges are written down
here, matching `inference.SamplingParams`, plus the server's caps (`PLAYGROUND_LIMITS`). The result is a
plain dict of SamplingParams keyword arguments that travels in the Celery task.
"""
import math
from collections.abc import Mapping
from typing import Any


class InvalidInput(ValueError):
    """A client sent something we refuse; the message is safe and meant to be shown to that client."""


def _number(params: Mapping[str, Any], name: str, low: float, high: float, *, low_open: bool = False) -> float:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"params.{name} must be a number")
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidInput(f"params.{name} must be in {bracket}{low}, {high}], got {value}")
    return float(value)


def _integer(params: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"params.{name} must be an integer")
    if not low <= value <= high:
        raise InvalidInput(f"params.{name} must be between {low} and {high}, got {value}")
    return value


def _stop(value: Any, limits: Mapping[str, int]) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidInput("params.stop must be a string or a list of strings")
    if len(stops) > limits["max_stop"]:
        raise InvalidInput(f"params.stop allows at most {limits['max_stop']} sequences")
    for s in stops:
        if not s or len(s) > limits["max_stop_length"]:
            raise InvalidInput(f"params.stop sequences must have 1 to {limits['max_stop_length']} characters")
    return stops


FIELDS = (
    "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "stop", "max_tokens",
)  # fmt: skip


def validate_sampling(params: Any, defaults: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, Any]:
    """Return complete SamplingParams kwargs from client `params` over `defaults`; raise InvalidInput."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidInput("params must be an object")
    unknown = sorted(set(params) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field(s) in params: {', '.join(unknown)}")
    merged = {**defaults, **params}
    top_k = _integer(merged, "top_k", -1, 1_000_000)
    seed = merged["seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise InvalidInput("params.seed must be null or an integer between 0 and 2^63-1")
    return {
        "n": _integer(merged, "n", 1, limits["max_n"]),
        "temperature": _number(merged, "temperature", 0.0, 100.0),
        "top_p": _number(merged, "top_p", 0.0, 1.0, low_open=True),
        "top_k": top_k,
        "min_p": _number(merged, "min_p", 0.0, 1.0),
        "repetition_penalty": _number(merged, "repetition_penalty", 0.0, 100.0, low_open=True),
        "presence_penalty": _number(merged, "presence_penalty", -2.0, 2.0),
        "frequency_penalty": _number(merged, "frequency_penalty", -2.0, 2.0),
        "seed": seed,
        "stop": _stop(merged["stop"], limits),
        "max_tokens": _integer(merged, "max_tokens", 1, limits["max_tokens"]),
    }
