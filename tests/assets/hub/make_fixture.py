"""Regenerate model_info.json, written in the shape of the hub's answer to GET /api/models/{repo}/revision/{sha}?blobs=true (what
HfApi.model_info(..., files_metadata=True) parses; made here, no network) for the default kimi-k3-tiny checkpoint.

Run: .venv/bin/python tests/assets/hub/make_fixture.py (after a change to the stand-in's checkpoint writer)."""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from k3deploy.sim.checkpoint import write_checkpoint

HERE = Path(__file__).parent
SHA = "9c1e2d0f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_checkpoint(root)
        (root / "README.md").write_bytes((HERE / "README.md").read_bytes())
        siblings = []
        for path in sorted(p for p in root.iterdir() if p.name != "k3-manifest.json"):
            data = path.read_bytes()
            entry = {"rfilename": path.name, "size": len(data),
                     "blobId": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
            if path.suffix == ".safetensors":  # git-lfs files: the blob is the pointer, the oid is the sha256
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n"
                entry["blobId"] = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer.encode()).hexdigest()
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": len(pointer)}
            siblings.append(entry)
    answer = {"_id": "66f0c0ffee0000000000k3t1", "id": "local/kimi-k3-tiny", "private": False,
              "pipeline_tag": "text-generation", "library_name": "transformers", "tags": ["safetensors", "kimi_k3"],
              "downloads": 0, "likes": 0, "modelId": "local/kimi-k3-tiny", "author": "local", "sha": SHA,
              "lastModified": "2026-11-30T08:00:00.000Z", "gated": False, "disabled": False,
              "createdAt": "2026-11-30T08:00:00.000Z", "usedStorage": sum(s["size"] for s in siblings),
              "siblings": siblings}
    (HERE / "model_info.json").write_text(json.dumps(answer, indent=1) + "\n")


if __name__ == "__main__":
    main()
