"""The API's request validation and response shapes, without a server (fast)."""
import json

import pytest
from django.conf import settings

from playground.api.errors import ApiError
from playground.api.responses import Shape, completion_logprobs, sse
from playground.api.schema import parse_body, parse_chat, parse_completion
from playground.serving.web import sampling

MODEL = "smollm2-135m-instruct"
LIMITS = settings.PLAYGROUND_LIMITS
DEFAULTS = sampling.api_defaults(True, LIMITS)
CHAT = [{"role": "user", "content": "hi"}]


def chat(**body):
    return parse_chat({"model": MODEL, "messages": CHAT, **body}, [MODEL, "sql-lora"], DEFAULTS, LIMITS)


def completion(**body):
    return parse_completion({"model": MODEL, "prompt": "Once", **body}, [MODEL, "sql-lora"], DEFAULTS, LIMITS, 100)


def refused(call, **body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(**body)
    return caught.value


def test_chat_maps_openai_fields_onto_sampling_params():
    request = chat(temperature=0, max_completion_tokens=5, n=2, stop="\n", seed=3, logprobs=True, top_logprobs=2,
                   presence_penalty=0.5, frequency_penalty=-0.5, stream=True, stream_options={"include_usage": True})
    assert request.params["max_tokens"] == 5 and request.params["n"] == 2
    assert request.params["stop"] == ["\n"] and request.params["seed"] == 3 and request.params["logprobs"] == 2
    assert request.params["presence_penalty"] == 0.5 and request.params["frequency_penalty"] == -0.5
    assert request.stream and request.include_usage and request.top_logprobs == 2
    assert request.messages == CHAT and request.prompts is None


def test_chat_defaults_and_content_parts():
    request = chat(messages=[{"role": "developer", "content": "Be terse."},
                             {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                              "name": "x"}])
    assert request.messages == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "ab", "name": "x"}]
    assert request.params["temperature"] == 1.0 and request.params["logprobs"] is None
    assert not request.stream and request.top_logprobs is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"max_tokens": 4, "max_completion_tokens": 4}, "max_tokens"),
        ({"n": 99}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tools": []}, "tools"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"messages": [{"role": "assistant", "content": "last"}]}, "messages"),
    ],
)
def test_chat_refuses_bad_fields_naming_them(body, param):
    error = refused(chat, **body)
    assert error.status == 400 and error.param == param
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_missing_model_400():
    assert refused(chat, model="gpt-4o").status == 404
    assert refused(completion, model="sql").status == 404  # not a prefix match of a served name
    assert chat(model="sql-lora").model == completion(model="sql-lora").model == "sql-lora"  # an adapter
    with pytest.raises(ApiError) as missing:
        parse_chat({"messages": CHAT}, [MODEL], DEFAULTS, LIMITS)
    assert missing.value.status == 400 and missing.value.param == "model"


def test_completion_prompt_rules():
    assert completion(prompt=["one"]).prompts == ["one"]
    assert completion().params["max_tokens"] == DEFAULTS["max_tokens"]
    assert completion(logprobs=3).top_logprobs == 3
    for body, param in [({"prompt": ""}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": "x" * 101}, "prompt"),
                        ({"prompt": [[1, 2], [-1]]}, "prompt"), ({"prompt": ["a", [1], None]}, "prompt"),
                        ({"prompt": [[1]], "echo": True}, "echo"), ({"suffix": "!"}, "suffix"), ({"best_of": 3}, "best_of"),
                        ({"logprobs": 6}, "logprobs")]:
        assert refused(completion, **body).param == param


def test_body_parsing_limits():
    assert parse_body(b'{"a": 1}', LIMITS, 100) == {"a": 1}
    assert refused(parse_body, raw=b"x" * 10, limits=LIMITS, max_bytes=5).status == 413
    assert refused(parse_body, raw=b"[1]", limits=LIMITS, max_bytes=100).status == 400
    assert refused(parse_body, raw=b"\xff", limits=LIMITS, max_bytes=100).status == 400


DONE = {
    "outputs": [{"index": 0, "text": "Hi there", "finish_reason": "stop",
                 "logprobs": [{"token": "Hi", "logprob": -0.1, "top": [{"token": "Hi", "logprob": -0.1}, {"token": "Yo", "logprob": -2.0}]},
                              {"token": " there", "logprob": -0.5, "top": [{"token": " there", "logprob": -0.5}]}]}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 4},
}


def test_chat_completion_body():
    body = Shape(True, chat(logprobs=True, top_logprobs=1), "r1").completion(DONE)
    assert body["id"] == "chatcmpl-r1" and body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hi there"} and choice["finish_reason"] == "stop"
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["Hi", " there"]
    assert choice["logprobs"]["content"][0]["top_logprobs"] == [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105]}]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 4}}


def test_completion_logprobs_offsets_and_no_logprobs_unless_asked():
    logprobs = completion_logprobs(DONE["outputs"][0]["logprobs"], top=2)
    assert logprobs["text_offset"] == [0, 2] and logprobs["top_logprobs"][0] == {"Hi": -0.1, "Yo": -2.0}
    body = Shape(False, completion(), "r2").completion(DONE)
    assert body["choices"][0]["text"] == "Hi there" and body["choices"][0]["logprobs"] is None


def test_stream_chunks_close_with_missing_text_and_usage():
    shape = Shape(True, chat(n=1, stream=True, stream_options={"include_usage": True}), "r3")
    assert shape.first_chunks()[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    final = shape.final_chunks(DONE, {0: "Hi"})[0]["choices"][0]
    assert final["delta"] == {"content": " there"} and final["finish_reason"] == "stop"
    assert shape.usage_chunk(DONE)["choices"] == [] and shape.usage_chunk(DONE)["usage"]["total_tokens"] == 9
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    assert json.loads(sse({"a": "é"})[6:]) == {"a": "é"}
