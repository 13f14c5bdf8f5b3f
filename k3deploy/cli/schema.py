"""`k3deploy schema`: the topology JSON Schema, for editors."""
from __future__ import annotations

import json


def schema() -> None:
    """Print the JSON Schema of topology files (point your editor's YAML plugin at it)."""
    from k3deploy.topology.schema import Topology

    doc = Topology.model_json_schema(by_alias=True)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "k3deploy topology"
    print(json.dumps(doc, indent=2))
