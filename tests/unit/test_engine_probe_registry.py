"""Preflight's engine probe reads vLLM's model registry from its source instead of importing vLLM (over a
minute on a loaded host, past the probe's bound), and imports only when a foreign plugin may add models."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k3deploy.executors.fleet import probe_source
from k3deploy.probes import engine_probe

FAST = pytest.mark.timeout(60)
REGISTRY = '''
_TEXT_GENERATION_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
                           "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM")}
_EMBEDDING_MODELS = {"BertModel": ("bert", "BertModel")}
_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_EMBEDDING_MODELS, "Extra": ("x", "Extra")}
'''


def _fake_vllm(root: Path, plugin: str | None = None) -> Path:
    """A `vllm` whose import fails loudly (the probe must not run it), with a literal registry."""
    pkg = root / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('vllm was imported')\n")
    (pkg / "model_executor" / "models" / "registry.py").write_text(REGISTRY)
    dist = root / "vllm-0.32.0+cpu.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    points = "[vllm.general_plugins]\nlora = vllm.plugins.lora:register\n"
    if plugin:
        points += f"other = {plugin}:register\n"
    (dist / "entry_points.txt").write_text(points)
    return root


def _probe(path: Path, archs: list[str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", probe_source(engine_probe), "vllm", "", json.dumps(archs)],
                         capture_output=True, text=True, timeout=50, check=True, env={"PYTHONPATH": str(path)})
    return dict(json.loads(out.stdout))


@FAST
def test_the_registry_is_read_without_importing_vllm(tmp_path: Path) -> None:
    got = _probe(_fake_vllm(tmp_path), ["DeepseekV3ForCausalLM", "KimiK3ForCausalLM", "Extra", "BertModel"])
    assert got["error"] == "" and got["version"] == "0.32.0+cpu", got
    assert got["known_archs"] == ["DeepseekV3ForCausalLM", "Extra", "BertModel"], got


@FAST
def test_a_foreign_plugin_makes_the_probe_ask_the_import(tmp_path: Path) -> None:
    got = _probe(_fake_vllm(tmp_path, plugin="vllm_ascend"), ["LlamaForCausalLM"])
    assert got["known_archs"] is None and "vllm was imported" in str(got["error"]), got


@FAST
def test_an_unknown_registry_layout_asks_the_import(tmp_path: Path) -> None:
    root = _fake_vllm(tmp_path)
    (root / "vllm" / "model_executor" / "models" / "registry.py").write_text("_VLLM_MODELS = build()\n")
    got = _probe(root, ["LlamaForCausalLM"])
    assert got["known_archs"] is None and "vllm was imported" in str(got["error"]), got
