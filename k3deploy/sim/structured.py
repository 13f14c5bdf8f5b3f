"""Structured output (`response_format`) as guided decoding answers it: for a JSON schema, a JSON value valid
against it (built from the schema's own constraints); for `json_object`, a JSON object. The `schema_ignored`
fault answers as if no response_format had been given."""
from __future__ import annotations

import json
from typing import Any

WORD = "stand-in"


class FormatError(ValueError):
    """A response_format the engine refuses (400)."""


def instance(schema: Any, depth: int = 0) -> Any:
    """The first value guided decoding could produce for `schema` (JSON Schema's common keywords)."""
    if not isinstance(schema, dict) or depth > 16:
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props: dict[str, Any] = schema.get("properties") or {}
        names = schema.get("required") or list(props)
        return {name: instance(props.get(name, {}), depth + 1) for name in names}
    if kind == "array":
        return [instance(schema.get("items", {}), depth + 1) for _ in range(int(schema.get("minItems", 1) or 0))]
    if kind in ("integer", "number"):
        value = schema["minimum"] if "minimum" in schema else schema.get("exclusiveMinimum", -1) + 1
        value = min(value, schema.get("maximum", value))
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = WORD * (int(schema.get("minLength", 0)) // len(WORD) + 1)  # at least minLength long
    return text[:int(schema.get("maxLength", len(text)))]


def structured_answer(body: dict[str, Any]) -> str | None:
    """The JSON text the answer must be under the request's response_format (None: free text)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise FormatError("response_format.type: expected one of text, json_object, json_schema")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return json.dumps({"answer": WORD})
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise FormatError("response_format.json_schema.schema: a JSON Schema object is required")
    return json.dumps(instance(spec["schema"]))
