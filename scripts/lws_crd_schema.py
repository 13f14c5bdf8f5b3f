"""Regenerate tests/assets/lws/leaderworkerset-v1.schema.json from the real LeaderWorkerSet CRD.

The CRD is kubernetes-sigs/lws's config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml at a release
tag (tests/assets/lws/README.md names the one shipped). With a clone of the repository:

    git -C lws show v0.10.0:config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml > crd.yaml
    python3 scripts/lws_crd_schema.py crd.yaml

The openAPIV3Schema of the served version `v1` is written as it is (compact JSON), less its `description` strings
(documentation only: they are 90% of the file and take no part in validation).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "assets" / "lws" / "leaderworkerset-v1.schema.json"
VERSION = "v1"  # the apiVersion k3deploy renders: leaderworkerset.x-k8s.io/v1


def without_descriptions(node: Any) -> Any:
    """The schema without its description strings (a property named `description` is a dict: it stays)."""
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    crd = yaml.safe_load(Path(argv[0]).read_text(encoding="utf-8"))
    if crd.get("kind") != "CustomResourceDefinition" or crd["spec"]["names"]["kind"] != "LeaderWorkerSet":
        print(f"{argv[0]}: not the LeaderWorkerSet CRD", file=sys.stderr)
        return 1
    versions = [v for v in crd["spec"]["versions"] if v["name"] == VERSION and v.get("served")]
    if not versions:
        print(f"{argv[0]}: serves no {VERSION}", file=sys.stderr)
        return 1
    schema = without_descriptions(versions[0]["schema"]["openAPIV3Schema"])
    OUT.write_text(json.dumps(schema, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
