"""The models a client may name: the base model and each LoRA adapter of PLAYGROUND_LORA_MODULES.

The API's `model` field and the chat socket's `model` both resolve here, so they accept the same names;
the adapter a name selects travels in the Job to the worker (`EngineService.submit`).
"""
from __future__ import annotations

from django.conf import settings

from .edge import InvalidInput


class UnknownModel(InvalidInput):
    """A model name this server does not serve."""


def base_model() -> str:
    return settings.PLAYGROUND_ENGINE["model"]


def served_models() -> list[str]:
    """The base model first, then the adapters in PLAYGROUND_LORA_MODULES's order."""
    return [base_model(), *settings.PLAYGROUND_LORA_MODULES]


def adapter_for(model: str | None) -> str | None:
    """The adapter `model` selects: None for the base model (or no model named); raises UnknownModel."""
    if model is None or model == base_model():
        return None
    if model not in settings.PLAYGROUND_LORA_MODULES:
        raise UnknownModel(f"the model {model!r} does not exist; this server serves {', '.join(served_models())}")
    return model
