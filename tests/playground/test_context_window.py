"""The context-window policy (playground/serving/worker/context_window.py): system prompt and latest turn kept,
whole oldest turns dropped, never a message cut, and a clear refusal when nothing can be dropped."""
import pytest

from inference.engine import load_tokenizer
from inference.llm import encode_chat
from inference.model_loader import DEFAULT_MODEL, resolve_model
from playground.serving.worker.context_window import fit_conversation, turn_starts

OVERHEAD = 3  # tokens the test's template adds per message


def encode(messages):
    """A chat template where each character is one token, plus OVERHEAD per message."""
    return [0] * sum(OVERHEAD + len(m["content"]) for m in messages)


def chat(turns: int, system: str | None = "be brief", size: int = 10) -> list[dict]:
    messages = [{"role": "system", "content": system}] if system is not None else []
    for i in range(turns):
        messages.append({"role": "user", "content": f"u{i}".ljust(size, ".")})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"a{i}".ljust(size, ".")})
    return messages


def test_a_conversation_that_fits_is_untouched():
    messages = chat(3)
    fitted = fit_conversation(messages, max_tokens=20, window=len(encode(messages)) + 20, encode=encode)
    assert fitted.messages == messages and fitted.prompt_ids == encode(messages)
    assert fitted.report()["dropped_messages"] == 0 and fitted.report()["dropped_tokens"] == 0


def test_the_fewest_oldest_turns_go_and_the_system_prompt_stays():
    messages = chat(5)  # system + 4 full turns (user, assistant) + the latest user message: 13 tokens each
    per_turn = 2 * (OVERHEAD + 10)
    window = len(encode(messages)) + 16 - 2 * per_turn + 1  # room for all but two turns
    fitted = fit_conversation(messages, max_tokens=16, window=window, encode=encode)
    assert fitted.messages == [messages[0]] + messages[5:]  # turns 0 and 1 (4 messages) dropped
    assert fitted.prompt_ids == encode(fitted.messages)
    assert [m["role"] for m in fitted.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    report = fitted.report()
    assert report["dropped_messages"] == 4 and report["dropped_turns"] == 2
    assert report["dropped_tokens"] == 2 * per_turn
    assert report["prompt_tokens"] + 16 <= window < report["prompt_tokens"] + 16 + per_turn
    # no message was cut: each kept one is one of the originals, whole
    assert all(m in messages for m in fitted.messages)


def test_without_a_system_prompt_the_latest_turn_stays():
    messages = chat(4, system=None)
    fitted = fit_conversation(messages, max_tokens=5, window=OVERHEAD + 10 + 5, encode=encode)
    assert fitted.messages == messages[-1:]
    assert fitted.report()["dropped_messages"] == 6


def test_a_latest_turn_too_long_for_max_tokens_gets_the_room_left():
    messages = chat(2)
    latest = len(encode([messages[0], messages[-1]]))
    fitted = fit_conversation(messages, max_tokens=100, window=latest + 7, encode=encode)
    assert fitted.messages == [messages[0], messages[-1]]
    assert fitted.report()["reply_room"] == 7


def test_no_room_at_all_is_refused_with_the_figures():
    messages = chat(2)
    latest = len(encode([messages[0], messages[-1]]))
    with pytest.raises(ValueError, match=f"take {latest} tokens; the context window is {latest} tokens"):
        fit_conversation(messages, max_tokens=4, window=latest, encode=encode)


def test_turn_starts_group_a_leading_reply_as_its_own_turn():
    messages = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"}]
    assert turn_starts(messages) == [1, 2, 4]


def test_with_the_real_chat_template_the_kept_prompt_fits():
    tokenizer = load_tokenizer(resolve_model(DEFAULT_MODEL))
    messages = chat(10, size=80)
    fitted = fit_conversation(messages, max_tokens=32, window=256, encode=lambda m: encode_chat(tokenizer, m))
    assert fitted.prompt_ids == encode_chat(tokenizer, fitted.messages)  # what the engine gets, as it would render it
    prompt = len(fitted.prompt_ids)
    assert prompt == fitted.prompt_tokens and prompt + 32 <= 256
    # one more turn would not have fitted: the fewest turns were dropped
    dropped = fitted.report()["dropped_messages"]
    assert dropped > 0 and fitted.messages == [messages[0]] + messages[1 + dropped:]
    one_more = [messages[0]] + messages[1 + dropped - 2:]
    assert len(encode_chat(tokenizer, one_more)) + 32 > 256
    assert fitted.messages[0] == messages[0] and fitted.messages[-1] == messages[-1]
