"""The one sampling table (playground/serving/web/sampling.py): what it accepts the engine accepts, at every
bound; the socket and the API validate by it; the page is served its controls from it (no copy in JS)."""
import math
from pathlib import Path

import pytest
from django.conf import settings

from inference.sampling_params import SamplingParams
from playground.serving.web import sampling
from playground.serving.web.edge import InvalidInput

LIMITS = settings.PLAYGROUND_LIMITS
STATIC = Path(__file__).resolve().parents[2] / "static"


def bounds(spec: sampling.Field) -> list:
    high = LIMITS[spec.cap] if spec.cap else spec.high
    if spec.kind == "strings":
        return [[], ["x" * LIMITS["max_stop_length"]] * int(high)]
    low = spec.low + (1e-6 if spec.low_open else 0)
    extra = ([None] if spec.kind == "optional-integer" else []) + ([spec.on] if spec.on is not None else [])
    return [low, high, spec.default, *extra]  # `on`: what the page's toggle sends


@pytest.mark.parametrize("spec", sampling.FIELDS, ids=lambda spec: spec.name)
def test_every_accepted_bound_is_accepted_by_the_engine(spec):
    for value in bounds(spec):
        params = sampling.validate_sampling({spec.name: value}, sampling.defaults(LIMITS), LIMITS)
        SamplingParams(**params)  # raises ValueError on a value the engine refuses


NUMERIC = [f for f in sampling.FIELDS if f.kind in ("number", "integer", "optional-integer")]


@pytest.mark.parametrize("spec", NUMERIC, ids=lambda f: f.name)
def test_just_outside_a_range_is_refused_naming_the_field(spec):
    high = LIMITS[spec.cap] if spec.cap else spec.high
    step = 1e-3 if spec.kind == "number" else 1
    outside = [high + step, spec.low if spec.low_open else spec.low - step]
    for value in outside:
        with pytest.raises(InvalidInput, match=f"params.{spec.name}"):
            sampling.validate_sampling({spec.name: value}, sampling.defaults(LIMITS), LIMITS)


def test_huge_integers_and_non_finite_numbers_are_refused_not_crashed_on():
    for value in (10**400, -(10**400), math.inf, math.nan):
        with pytest.raises(InvalidInput, match="params.temperature"):
            sampling.validate_sampling({"temperature": value}, sampling.defaults(LIMITS), LIMITS)


def test_every_table_field_is_a_sampling_param_and_defaults_are_the_engines_kwargs():
    engine_fields = set(SamplingParams.__dataclass_fields__)
    assert sampling.NAMES <= engine_fields
    SamplingParams(**sampling.defaults(LIMITS))
    SamplingParams(**sampling.api_defaults(False, LIMITS))


def test_the_page_gets_its_controls_from_the_table_with_the_caps_applied():
    specs = {spec["name"]: spec for spec in sampling.page_specs({**LIMITS, "max_tokens": 100, "max_n": 2})}
    assert list(specs) == [f.name for f in sampling.FIELDS]
    assert specs["max_tokens"]["max"] == 100 and specs["max_tokens"]["value"] == 100  # default lowered to the cap
    assert specs["n"]["max"] == 2 and specs["top_p"]["min_open"] is True
    assert specs["stop"]["max"] == LIMITS["max_stop"] and specs["stop"]["max_length"] == LIMITS["max_stop_length"]
    page_code = "".join(p.read_text() for p in (STATIC / "chat").glob("*.js"))
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_p"):
        assert name not in page_code  # no field is spelled out in the page's scripts


def test_the_page_learns_each_fields_api_spelling_and_api_default_from_the_table():
    """What the page's "View code" writes: the API's name and default of each field, vLLM's extras marked (the
    openai client sends those in extra_body), the token-probabilities toggle as the API's logprobs/top_logprobs."""
    specs = {spec["name"]: spec for spec in sampling.page_specs(LIMITS)}
    assert specs["temperature"]["api"] == {"name": "temperature", "default": 1.0, "with": {}, "vllm_extra": False}
    assert specs["temperature"]["value"] == 0.7  # the page's default differs: the snippet must spell it out
    assert {name for name, spec in specs.items() if spec["api"]["vllm_extra"]} == {"top_k", "min_p",
                                                                                   "repetition_penalty"}
    toggle = specs["logprobs"]
    assert toggle["kind"] == "toggle" and toggle["on"] == 5 and toggle["value"] is None
    assert toggle["api"] == {"name": "top_logprobs", "default": None, "with": {"logprobs": True}, "vllm_extra": False}
    # The API reads its own logprobs (chat: a boolean; completions: 0..5), not the socket's.
    assert "logprobs" in sampling.NAMES and "logprobs" not in sampling.API_NAMES
