"""OpenAI's `response_format`, which the API's chat completions and the chat socket's generate frame both
take: the constraint it asks for, as plain data (the kwargs of `inference.sampling_params.
StructuredOutputsParams`, which travel to the worker inside the sampling params). Only the field's shape is
checked here; the engine is the one judge of a schema (playground/api/structured.py says more)."""
import re
from typing import Any

from .edge import InvalidInput

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function and schema names


def response_format_constraint(value: Any) -> dict[str, Any] | None:
    """The StructuredOutputsParams kwargs of an OpenAI `response_format` (None for text); the chat socket's
    generate frame takes the same field. Raises InvalidInput."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return {"json_object": True}
    if kind != "json_schema" or set(value) != {"type", "json_schema"}:
        raise InvalidInput("response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                           "{'type': 'json_schema', 'json_schema': {...}}")
    spec = value["json_schema"]
    if not isinstance(spec, dict) or set(spec) - {"name", "description", "schema", "strict"}:
        raise InvalidInput("response_format.json_schema must be an object with name, schema and optionally "
                           "description and strict")
    if not isinstance(spec.get("name"), str) or not NAME.match(spec["name"]):
        raise InvalidInput("response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-'")
    if not isinstance(spec.get("schema"), dict):
        raise InvalidInput("response_format.json_schema.schema must be a JSON schema object")
    if spec.get("strict") not in (None, True, False):
        raise InvalidInput("response_format.json_schema.strict must be a boolean")
    return {"json": spec["schema"]}
