"""The Celery task on queue `gpu`: hand one chat request to this worker's long-lived engine."""
from typing import Any

from celery import shared_task

from . import runtime
from ..shared.naming import TASK_NAME


@shared_task(name=TASK_NAME, ignore_result=True)
def generate(
    request_id: str,
    messages: list[dict[str, str]] | None,
    params: dict[str, Any],
    cache_salt: str | None = None,
    prompt: str | None = None,
    adapter: str | None = None,
    fit_window: bool = False,
) -> None:
    """Blocks this task thread until the request ends; tokens flow through the channel layer, not here.
    A chat request gives `messages`; a plain completion (the OpenAI API's /v1/completions) gives `prompt`;
    `adapter` names a LoRA adapter of PLAYGROUND_LORA_MODULES (None: the base model); `fit_window`: drop the
    oldest turns that do not fit the context window instead of refusing (worker/context_window.py)."""
    runtime.current().serve(request_id, messages, params, cache_salt, prompt, adapter, fit_window)
