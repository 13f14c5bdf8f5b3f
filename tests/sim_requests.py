"""Requests the stand-in engine tests send: a tool definition and a long first turn for prefix caching."""
from __future__ import annotations

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
LONG_QUESTION = " ".join(f"word{i % 97}" for i in range(1100)) + " so what is the summary?"
