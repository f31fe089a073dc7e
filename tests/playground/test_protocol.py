"""Frame parsing and sampling-parameter validation of /ws/chat/ (no database, no engine)."""
import json
import uuid

import pytest
from django.conf import settings

from playground.chat.protocol import parse_cancel, parse_generate, parse_messages
from playground.serving.web import sampling
from playground.serving.web.edge import InvalidInput, decode_frame
from playground.serving.web.sampling import validate_sampling

LIMITS = settings.PLAYGROUND_LIMITS
DEFAULTS = sampling.defaults(LIMITS)
HELLO = [{"role": "user", "content": "hello"}]


def generate(**fields):
    return parse_generate({"type": "generate", "messages": HELLO, **fields}, DEFAULTS, LIMITS)


def test_generate_fills_defaults_and_keeps_given_values():
    request = generate(params={"temperature": 0, "max_tokens": 5, "stop": "\n"})
    assert request.conversation_id is None
    assert request.messages == HELLO
    assert request.params == {**DEFAULTS, "temperature": 0.0, "max_tokens": 5, "stop": ["\n"]}


def test_conversation_id_is_parsed_as_uuid():
    cid = uuid.uuid4()
    assert generate(conversation_id=str(cid)).conversation_id == cid


@pytest.mark.parametrize("bad", [123, "not-a-uuid", {"id": 1}])
def test_bad_conversation_id(bad):
    with pytest.raises(InvalidInput, match="conversation_id"):
        generate(conversation_id=bad)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"n": 0}, "n"),
        ({"n": LIMITS["max_n"] + 1}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": LIMITS["max_tokens"] + 1}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a"] * (LIMITS["max_stop"] + 1)}, "stop"),
        ({"stop": 7}, "stop"),
        ({"stop": ["x" * (LIMITS["max_stop_length"] + 1)]}, "stop"),
        ({"beam_width": 4}, "beam_width"),
    ],
)
def test_bad_sampling_values_name_the_field(params, field):
    with pytest.raises(InvalidInput, match=field):
        generate(params=params)


def test_params_must_be_an_object():
    with pytest.raises(InvalidInput, match="params must be an object"):
        validate_sampling([1, 2], DEFAULTS, LIMITS)


@pytest.mark.parametrize(
    "messages, needle",
    [
        ([], "non-empty"),
        ("hi", "non-empty"),
        ([{"role": "user"}], "exactly"),
        ([{"role": "user", "content": "a", "name": "x"}], "exactly"),
        ([{"role": "tool", "content": "a"}], "role must be one of"),
        ([{"role": "user", "content": 5}], "must be a string"),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}],
         "first message"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "last message"),
        ([{"role": "user", "content": "   "}], "empty"),
        ([{"role": "user", "content": "x" * (LIMITS["max_message_chars"] + 1)}], "longer than"),
        ([{"role": "user", "content": "a"}] * (LIMITS["max_messages"] + 1), "at most"),
    ],
)
def test_bad_messages(messages, needle):
    with pytest.raises(InvalidInput, match=needle):
        parse_messages(messages, LIMITS)


def test_system_first_and_history_are_accepted():
    transcript = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert parse_messages(transcript, LIMITS) == transcript


def test_unknown_generate_field_is_refused():
    with pytest.raises(InvalidInput, match="prompt"):
        generate(prompt="x")


@pytest.mark.parametrize(
    "text, needle",
    [(None, "text frames"), ("{", "not valid JSON"), ("[1]", "JSON object"), ('"x"', "JSON object")],
)
def test_decode_frame_refuses_non_objects(text, needle):
    with pytest.raises(InvalidInput, match=needle):
        decode_frame(text, {**LIMITS, "max_frame_bytes": 1024})


def test_decode_frame_refuses_oversize_frames():
    frame = json.dumps({"type": "generate", "pad": "x" * 2000})
    with pytest.raises(InvalidInput, match="larger than 1024 bytes"):
        decode_frame(frame, {**LIMITS, "max_frame_bytes": 1024})
    assert decode_frame(frame, {**LIMITS, "max_frame_bytes": 4096})["type"] == "generate"


def test_cancel_needs_request_id():
    assert parse_cancel({"type": "cancel", "request_id": "abc"}).request_id == "abc"
    with pytest.raises(InvalidInput, match="request_id"):
        parse_cancel({"type": "cancel"})
