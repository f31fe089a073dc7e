"""The models a client may name (the base model and each LoRA adapter of PLAYGROUND_LORA_MODULES), and the
context window they are served with.

The API's `model` field and the chat socket's `model` both resolve here, so they accept the same names;
the adapter a name selects travels in the Job to the worker (`EngineService.submit`).
"""
from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from ..shared import registry
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


def served_max_model_len() -> int | None:
    """The longest sequence a request may use, as the workers resolved it: each worker's engine derives its
    `max_model_len` from the model and its KV pool unless ENGINE_MAX_MODEL_LEN sets it, and its heartbeat
    carries the value. The smallest live worker's, since any of them may serve the next request; before any
    worker has loaded, the configured value (None when the engine derives it)."""
    reported = [w["max_model_len"] for w in registry.live_workers() if w.get("max_model_len")]
    return min(reported) if reported else settings.PLAYGROUND_ENGINE["max_model_len"]


aserved_max_model_len = sync_to_async(served_max_model_len, thread_sensitive=False)


def served_sampling_suggestions() -> dict[str, Any]:
    """The model's generation_config.json sampling suggestions, as a live worker reports them ({} before one
    has loaded, or for a model without any): the API's defaults for the fields a request leaves unset, as
    vLLM's server applies them. Every worker serves the same model, so the first live report stands."""
    for worker in registry.live_workers():
        if worker.get("suggested_sampling") is not None:
            return worker["suggested_sampling"]
    return {}


aserved_sampling_suggestions = sync_to_async(served_sampling_suggestions, thread_sensitive=False)
