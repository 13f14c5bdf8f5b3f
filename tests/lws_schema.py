"""LeaderWorkerSet objects checked against the real CRD's openAPIV3Schema (tests/assets/lws, kubernetes-sigs/lws
v0.10.0) as the API server checks a custom resource under `kubectl apply` (field validation Strict):

- an unknown field is an error wherever the schema lists `properties` and does not say
  `x-kubernetes-preserve-unknown-fields` (the server prunes or, strict, rejects it; jsonschema alone allows it);
- `x-kubernetes-list-type: set` items and `map` keys are unique (duplicates are rejected);
- `format: int32` / `int64` values fit their width;
- the object's name is a DNS-1035 label: LWS's validating webhook (pkg/webhooks/leaderworkerset_webhook.go,
  generalValidate) requires it, the name being that of the group's headless Service; and it is short enough
  for the worker StatefulSets' pods to start (LWS's troubleshooting guide).
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

ASSET = Path(__file__).resolve().parent / "assets" / "lws" / "leaderworkerset-v1.schema.json"
API_VERSION = "leaderworkerset.x-k8s.io/v1"
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_WIDTH = {"int32": 2**31, "int64": 2**63}


def strict(node: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its properties and does not
    preserve unknown fields (a copy)."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "default", "required") else strict(v)) for k, v in node.items()}
    if "properties" in node:  # the names under properties are field names, not schemas
        out["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


def _list_type(validator: Any, kind: str, items: Any, schema: dict[str, Any]) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not isinstance(items, list) or kind == "atomic":
        return
    # A missing map key takes its default, as the server defaults before it validates (ports: protocol TCP).
    fields = schema.get("items", {}).get("properties", {})
    keys = {k: fields.get(k, {}).get("default") for k in schema.get("x-kubernetes-list-map-keys", [])}
    seen: list[Any] = []
    for item in items:
        key = item if kind == "set" else [item.get(k, d) if isinstance(item, dict) else None for k, d in keys.items()]
        if key in seen:
            yield ValidationError(f"duplicate entry {key!r} in a list of type {kind}")
        seen.append(key)


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    formats = jsonschema.FormatChecker()
    for name, width in _WIDTH.items():
        formats.checks(name)(lambda v, w=width: not isinstance(v, int) or -w <= v < w)
    cls = jsonschema.validators.extend(jsonschema.Draft7Validator, {"x-kubernetes-list-type": _list_type})
    schema = strict(json.loads(ASSET.read_text(encoding="utf-8")))
    cls.check_schema(schema)
    return cls(schema, format_checker=formats)


def name_limit(replicas: Any) -> int:
    """The longest LWS name whose groups' pods start: LWS's troubleshooting guide ("Unable to Create LWS Object
    with a Name Exceeding 51 Characters", kubernetes#64023), counted exactly for the last group's index."""
    return 63 - 11 - 1 - len(str(max(replicas - 1, 0) if isinstance(replicas, int) else 0))


def lws_errors(obj: dict[str, Any]) -> list[str]:
    """Every way `obj` fails the LeaderWorkerSet CRD (and the webhook's name rule), as `path: message`."""
    errors = [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
              for e in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != "LeaderWorkerSet":
        errors.append(f"(root): not a {API_VERSION} LeaderWorkerSet: {obj.get('apiVersion')} {obj.get('kind')}")
    name = obj.get("metadata", {}).get("name")
    if not isinstance(name, str) or len(name) > 63 or not DNS_1035_LABEL.fullmatch(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label (LWS's webhook: a-z first, a-z0-9- then, "
                      "at most 63 characters)")
    elif len(name) > (most := name_limit(obj.get("spec", {}).get("replicas", 1))):
        errors.append(f"metadata.name: {name!r} is longer than the {most} characters a worker StatefulSet NAME-i "
                      "leaves room for (its pods' revision label NAME-i-<10-character hash> is a 63-character label)")
    return errors


def mutated(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with the dotted `path` set to `value` (list indices as numbers)."""
    out = copy.deepcopy(obj)
    *parents, last = path.split(".")
    cur: Any = out
    for p in parents:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    cur[int(last) if isinstance(cur, list) else last] = value
    return out
