"""Tokenising a caller's text: `encode_text` and `encode_chat` give exactly what transformers' own calls give."""

import pytest

from inference.input_processor import encode_text, load_tokenizer
from inference.llm import encode_chat
from inference.model_loader import DEFAULT_MODEL, resolve_model

TEXTS = ["Hello!", " a leading space", "<|im_start|>user\nhi<|im_end|>", "emoji 🤖, ünïcödé\n\n\ttabs", "word " * 2000]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And again?"}]


@pytest.fixture()
def tokenizer():
    """A tokenizer of its own: a test below changes its Rust tokenizer's settings."""
    return load_tokenizer(resolve_model(DEFAULT_MODEL))


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_encode_text_equals_transformers(tokenizer, add_special_tokens):
    for text in TEXTS:
        assert encode_text(tokenizer, text, add_special_tokens) == tokenizer.encode(
            text, add_special_tokens=add_special_tokens)


def test_encode_chat_equals_apply_chat_template(tokenizer):
    assert encode_chat(tokenizer, CHAT) == list(
        tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False))
    partial = CHAT[:3]  # the assistant's reply left open, to be continued
    assert encode_chat(tokenizer, partial, add_generation_prompt=False, continue_final_message=True) == list(
        tokenizer.apply_chat_template(partial, continue_final_message=True, tokenize=True, return_dict=False))


def test_truncation_on_the_rust_tokenizer_is_not_applied(tokenizer):
    """transformers clears a truncation set on the Rust tokenizer before it encodes; so must we."""
    full = tokenizer.encode(TEXTS[-1], add_special_tokens=False)
    tokenizer.backend_tokenizer.enable_truncation(max_length=8)
    assert encode_text(tokenizer, TEXTS[-1]) == full
    assert len(full) > 8
