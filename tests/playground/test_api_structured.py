"""response_format and tools on /v1/chat/completions: the constraint a request builds and the reply read back,
without a server (fast). The official `openai` client against the running playground: test_api.py."""
import json
import re

import jsonschema
import pytest
from django.conf import settings
from structured_cases import TOOLS, WEATHER_CHAT

from playground.api.errors import ApiError
from playground.api.responses import Shape
from playground.api.schema import parse_chat
from playground.api.structured import api_message
from playground.serving.web import sampling

MODEL = "smollm2-135m-instruct"
LIMITS = settings.PLAYGROUND_LIMITS
DEFAULTS = sampling.api_defaults(True, LIMITS)
CHAT = WEATHER_CHAT


def chat(**body):
    return parse_chat({"model": MODEL, "messages": CHAT, **body}, MODEL, DEFAULTS, LIMITS)


def refused(**body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        chat(**body)
    assert caught.value.status == 400
    return caught.value


def done(text, finish_reason="stop"):
    return {"outputs": [{"index": 0, "text": text, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "cached_tokens": 0}}


def test_response_format_becomes_the_engine_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = chat(response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema,
                                                                          "strict": True}})
    assert request.params["structured_outputs"] == {"json": schema}
    assert chat(response_format={"type": "json_object"}).params["structured_outputs"] == {"json_object": True}
    assert "structured_outputs" not in chat(response_format={"type": "text"}).params
    assert "structured_outputs" not in chat().params


@pytest.mark.parametrize("body, param, message", [
    ({"response_format": {"type": "xml"}}, "response_format", "response_format must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     r"json_schema\.schema must be a JSON schema object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}, "response_format",
     r"json_schema\.name must be"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools",
     r"tools\[0\]\.function\.parameters must be"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "given twice"),
    ({"tools": [{"type": "retrieval"}]}, "tools", r"tools\[0\] must be"),
    ({"tool_choice": "auto"}, "tool_choice", "tool_choice requires tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'nope', which is not in tools"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "cannot be combined"),
])
def test_bad_structured_fields_are_400_naming_them(body, param, message):
    error = refused(**body)
    assert error.param == param
    assert re.search(message, error.message)


def test_tool_choices_constrain_the_reply_to_calls_or_an_answer():
    auto = chat(tools=TOOLS)
    schema = auto.params["structured_outputs"]["json"]
    assert set(schema["$defs"]) == {"get_weather", "add"} and len(schema["anyOf"]) == 3
    call = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    jsonschema.validate(call, schema)
    jsonschema.validate({"content": "Sunny."}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"city": "Paris"}}, schema)
    required = chat(tools=TOOLS, tool_choice="required").params["structured_outputs"]["json"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"content": "Sunny."}, required)
    named = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert list(named.params["structured_outputs"]["json"]["$defs"]) == ["add"]
    assert "add" in named.messages[0]["content"] and "get_weather" not in named.messages[0]["content"]
    none = chat(tools=TOOLS, tool_choice="none")
    assert "structured_outputs" not in none.params and none.messages == CHAT
    # The tools are described in the system message, after the user's own.
    system = chat(tools=TOOLS, messages=[{"role": "system", "content": "Be brief."}, *CHAT]).messages[0]
    assert system["content"].startswith("Be brief.\n\nYou can call these functions:")


def test_a_tool_call_reply_in_openai_shape_whole_and_streamed():
    request = chat(tools=TOOLS)
    shape = Shape(True, request, "r1")
    text = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    choice = shape.completion(done(text))["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert not shape.streams_text
    [chunk] = shape.final_chunks(done(text), {})
    delta = chunk["choices"][0]["delta"]
    assert delta["tool_calls"][0]["index"] == 0 and delta["tool_calls"][0]["function"]["name"] == "get_weather"
    assert chunk["choices"][0]["finish_reason"] == "tool_calls"
    answer = shape.completion(done('{"content": "It is sunny."}'))["choices"][0]
    assert answer["message"] == {"role": "assistant", "content": "It is sunny."} and answer["finish_reason"] == "stop"
    cut = shape.completion(done('{"name": "get_wea', "length"))["choices"][0]
    assert cut["message"]["content"] == '{"name": "get_wea' and cut["finish_reason"] == "length"


def test_tool_turns_are_sent_to_the_model_in_its_own_format():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
    messages = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    request = chat(tools=TOOLS, tool_choice="none", messages=messages)
    assert request.messages[1] == {"role": "assistant",
                                   "content": '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'}
    assert request.messages[2] == {"role": "user", "content": 'Result of the function call: {"temperature": 21}'}


def test_engine_refusals_are_named_in_the_request_terms():
    schema_request = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
    engine = "structured_outputs.json: unsupported JSON schema keyword(s): /uniqueItems: item uniqueness cannot be enforced"
    assert api_message(schema_request.structured, engine).startswith("response_format.json_schema.schema: unsupported")
    tools_request = chat(tools=TOOLS)
    engine = "structured_outputs.json: invalid JSON schema at /$defs/get_weather/properties/unit/type: 'x' is not valid"
    assert api_message(tools_request.structured, engine) == (
        "tools: invalid JSON schema at function 'get_weather' parameters /properties/unit/type: 'x' is not valid")
    assert api_message(chat().structured, "prompt too long") == "prompt too long"
