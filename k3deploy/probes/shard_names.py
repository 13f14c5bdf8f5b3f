"""The checkpoint's file names and how a probe's messages name them (stdlib only; shipped with the shard probe,
read by the host too)."""
from __future__ import annotations

import re

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"  # the single-file form: no index (small models ship so)
CONFIG_FILE = "config.json"
# msModelSlim's per-tensor quantization (W4A8_DYNAMIC, W8A8_DYNAMIC, FLOAT), read by vLLM-Ascend's
# `--quantization ascend` (vllm_ascend/quantization/modelslim_config.py MODELSLIM_CONFIG_FILENAME).
QUANT_FILE = "quant_model_description.json"
MANIFEST_FILE = "k3-manifest.json"
SHARD_RE = re.compile(r"-(\d{5})-of-\d{5}\.safetensors$")
MAX_LISTED = 5


def label(name: str) -> str:
    """'shard 00042' for model-00042-of-00096.safetensors, else the file name."""
    m = SHARD_RE.search(name)
    return f"shard {m.group(1)}" if m else name


def listed(names: list[str]) -> str:
    """The first few names and how many more."""
    more = len(names) - MAX_LISTED
    return ", ".join(names[:MAX_LISTED]) + (f" and {more:,} more" if more > 0 else "")
