"""Schemas and tools shared by the structured-output API tests (test_api_structured.py, test_api.py)."""

WEATHER_CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
