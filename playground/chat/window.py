"""What the chat page's context meter needs to draw before the worker has measured anything.

The worker fits a conversation into the window with the model's tokenizer (serving/worker/context_window.py)
and its `done` frame says exactly how many tokens the conversation took; the page counts with those. Text the
worker has not seen (the draft being typed, a system prompt just edited, a conversation opened from the
history) is estimated in the browser with the figures below, which the page gets from here and never spells
out itself.
"""
from typing import Any

from playground.serving.web.models import served_max_model_len

# Characters per token of English text under SmolLM2's tokenizer: 3.1 on docs/protocol.md's first 6,000
# characters, 3.6 on README.md's (code and non-Latin scripts take more tokens). An estimate, so the meter
# marks counts that use it with "~".
CHARS_PER_TOKEN = 3.5
# The chat template's markers around one message: "<|im_start|>", the role, "\n" before it and "<|im_end|>",
# "\n" after it in ChatML, which SmolLM2 uses.
TOKENS_PER_MESSAGE = 5


def meter_config() -> dict[str, Any]:
    """The window (the workers' max_model_len; None until a worker has loaded its model, when the page says so)
    and the estimate's figures."""
    return {
        "window": served_max_model_len(),
        "chars_per_token": CHARS_PER_TOKEN,
        "tokens_per_message": TOKENS_PER_MESSAGE,
    }
