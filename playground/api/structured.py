"""`response_format` and `tools` on /v1/chat/completions: the constraint the engine's grammar mask follows,
and the reply read back in OpenAI's shape (docs/api.md, "Structured outputs and tools").

The web process never loads the engine, so it checks only the shape of these fields and builds the
constraint as plain data: the kwargs of `inference.sampling_params.StructuredOutputsParams`, which travel
to the worker inside the sampling params. The engine is the one judge of a schema (is it valid, does it
use a keyword the mask cannot enforce); what it refuses comes back as a 400 whose message `api_message`
rewrites into the request's own field names.

Tools use a model-agnostic format, since SmolLM2's chat template has no tool syntax. The tools are listed
in the system message and the reply is constrained to one JSON object:
- tool_choice "required": `{"name": <a tool>, "arguments": <that tool's parameters>}`, a call;
- a named function (`{"type": "function", "function": {"name": ...}}`): a call of that tool;
- "auto" (the default with tools): a call, or `{"content": <text>}`, an answer. The model decides: under the
  mask it may write either, and its first key (`"name"` or `"content"`) commits it.
- "none": the tools are not offered and the reply is plain text (or follows `response_format`).
One reply holds at most one call. A call comes back as `message.tool_calls` with `finish_reason:
"tool_calls"`; while streaming, a reply to a request with tools is sent whole in the closing chunk, since
its text is JSON the client must not see. In the conversation sent back, an assistant message's
`tool_calls` become its text in the same JSON format and a `tool` message becomes a user message holding the
result, so the model sees its own format.
"""
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playground.serving.web.edge import InvalidInput
from playground.serving.web.response_format import NAME, response_format_constraint

from .errors import ApiError

FIELDS = {"response_format", "tools", "tool_choice", "parallel_tool_calls"}
ENGINE_FIELD = re.compile(r"structured_outputs\.\w+")
DEFS = re.compile(r"/\$defs/([A-Za-z0-9_-]+)")  # where a tool's parameters sit in the reply schema
ANSWER_SCHEMA = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Structured:
    """What a chat request asked for beyond plain text."""

    constraint: dict[str, Any] | None  # StructuredOutputsParams kwargs; None for plain text
    field: str  # the request field the constraint came from, for error messages
    tools: dict[str, dict[str, Any]]  # offered tools by name ({} when replies are not tool calls)
    tool_prompt: str | None  # the system text that describes the tools

    @property
    def tool_replies(self) -> bool:
        return bool(self.tools)


def parse(body: Mapping[str, Any]) -> Structured:
    """Read response_format, tools and tool_choice; raise ApiError (400) naming the field."""
    try:
        json_constraint = response_format_constraint(body.get("response_format"))
    except InvalidInput as exc:
        raise ApiError(400, str(exc), param="response_format") from None
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    if choice == "none":
        return Structured(json_constraint, "response_format", {}, None)
    if json_constraint is not None:
        raise ApiError(400, "response_format cannot be combined with tools unless tool_choice is 'none'",
                       param="response_format")
    offered = tools if choice in ("auto", "required") else {choice: tools[choice]}
    calls = [
        {"type": "object", "properties": {"name": {"const": name}, "arguments": {"$ref": f"#/$defs/{name}"}},
         "required": ["name", "arguments"]}
        for name in offered
    ]
    answer = [ANSWER_SCHEMA] if choice == "auto" else []
    schema = {"$defs": offered, "anyOf": calls + answer}
    return Structured({"json": schema}, "tools", offered, _tool_prompt(body["tools"], offered, choice == "auto"))


def _tools(value: Any) -> dict[str, dict[str, Any]]:
    """{name: parameters schema}, in the order given."""
    if value is None:
        return {}
    if not isinstance(value, list) or not value:
        raise ApiError(400, "tools must be a non-empty list", param="tools")
    tools: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) != {"type", "function"}:
            raise ApiError(400, f"{where} must be {{'type': 'function', 'function': {{...}}}}", param="tools")
        function = tool["function"]
        if not isinstance(function, dict) or set(function) - {"name", "description", "parameters", "strict"}:
            raise ApiError(400, f"{where}.function must be an object with name and optionally description, "
                                "parameters and strict", param="tools")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ApiError(400, f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'", param="tools")
        if name in tools:
            raise ApiError(400, f"{where}.function.name {name!r} is given twice", param="tools")
        if not isinstance(function.get("description", ""), str):
            raise ApiError(400, f"{where}.function.description must be a string", param="tools")
        parameters = function.get("parameters", NO_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema object", param="tools")
        if "$ref" in json.dumps(parameters):  # its refs would point into our wrapper schema, not its own
            raise ApiError(400, f"{where}.function.parameters: $ref is not supported in tool parameters; "
                                "inline the definitions", param="tools")
        tools[name] = parameters
    return tools


def _tool_choice(value: Any, tools: Mapping[str, Any]) -> str:
    """'none', 'auto', 'required' or the name of the one tool to call."""
    if value is None:
        return "auto" if tools else "none"
    if not tools:
        raise ApiError(400, "tool_choice requires tools", param="tool_choice")
    if value in ("none", "auto", "required"):
        return value
    name = value.get("function", {}).get("name") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        raise ApiError(400, "tool_choice must be 'none', 'auto', 'required' or "
                            "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
    if name not in tools:
        raise ApiError(400, f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    return name


def _tool_prompt(raw_tools: list[dict[str, Any]], offered: Mapping[str, Any], may_answer: bool) -> str:
    listed = [
        {"name": t["function"]["name"], "description": t["function"].get("description", ""),
         "parameters": offered[t["function"]["name"]]}
        for t in raw_tools if t["function"]["name"] in offered
    ]
    text = (f"You can call these functions:\n{json.dumps(listed)}\n"
            'To call one, reply with {"name": <function name>, "arguments": <its arguments>}.')
    if may_answer:
        text += ' To answer without a function, reply with {"content": <your answer>}.'
    return text


# --- the conversation ------------------------------------------------------------------------------

def plain_messages(raw: Any) -> Any:
    """OpenAI tool turns as plain ones, in the reply format the model was constrained to (see above)."""
    if not isinstance(raw, list):
        return raw
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            messages.append(message)
        elif message.get("role") == "tool":
            if set(message) - {"role", "content", "tool_call_id", "name"}:
                raise ApiError(400, f"messages[{i}]: a tool message has role, content and tool_call_id",
                               param="messages")
            messages.append({"role": "user", "content": f"Result of the function call: {_text(message, i)}"})
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            messages.append({"role": "assistant", "content": _calls_as_text(message["tool_calls"], i)})
        else:
            messages.append(message)
    return messages


def _text(message: Mapping[str, Any], i: int) -> str:
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        content = "".join(p for p in parts if isinstance(p, str))
    if not isinstance(content, str):
        raise ApiError(400, f"messages[{i}].content must be a string", param="messages")
    return content


def _calls_as_text(calls: Any, i: int) -> str:
    texts = []
    for call in calls if isinstance(calls, list) else [None]:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, f"messages[{i}].tool_calls must be a list of function calls", param="messages")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            raise ApiError(400, f"messages[{i}].tool_calls: arguments must be a JSON text", param="messages") from None
        texts.append(json.dumps({"name": function["name"], "arguments": arguments}))
    return "\n".join(texts)


def with_tool_prompt(messages: list[dict[str, str]], structured: Structured) -> list[dict[str, str]]:
    """The transcript with the tools described in its system message (one is added if it has none)."""
    if structured.tool_prompt is None:
        return messages
    if messages[0]["role"] == "system":
        system = {"role": "system", "content": f"{messages[0]['content']}\n\n{structured.tool_prompt}"}
        return [system, *messages[1:]]
    return [{"role": "system", "content": structured.tool_prompt}, *messages]


# --- the reply -------------------------------------------------------------------------------------

def reply(structured: Structured | None, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
    """The assistant message of one choice and its finish reason, in OpenAI's shape.

    A reply cut short (max_tokens) is not JSON yet: it is returned as text, with its finish reason.
    """
    if structured is None or not structured.tool_replies:
        return {"role": "assistant", "content": text}, finish_reason
    try:
        value = json.loads(text)
    except ValueError:
        return {"role": "assistant", "content": text}, finish_reason
    if "name" not in value:
        return {"role": "assistant", "content": value["content"]}, finish_reason
    call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"


def api_message(structured: Structured | None, message: str) -> str:
    """An engine refusal in the request's own terms: the engine names its fields, not the API's."""
    if structured is None or structured.constraint is None:
        return message
    if structured.field == "response_format" and "json" in structured.constraint:
        field = "response_format.json_schema.schema"
    else:
        field = structured.field
    message = ENGINE_FIELD.sub(field, message)
    return DEFS.sub(lambda m: f"function {m.group(1)!r} parameters " if m.group(1) in structured.tools
                    else m.group(0), message)
