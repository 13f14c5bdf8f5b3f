"""Run by the engine's own interpreter on a node (shipped by source): its version, whether it knows the
checkpoint's architecture, its torch, Ray and Python versions; one JSON line.

argv: KIND (sglang | vllm | vllm-ascend | sim), MIMIC (sim only), ARCHITECTURES (JSON list)."""
import ast
import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import sys

# The stand-in engine (kind sim) is the engine under test here, like SGLang or vLLM: loaded by name in the
# engine's interpreter, never a part of this probe (a probe ships alone and imports nothing of k3deploy).
SIM_MODEL_INFO, SIM_ENGINE_ARGS = "k3deploy.sim.model_info", "k3deploy.sim.engine_args"
SIM_EXTRAS = "k3deploy.extras"  # what the stand-in needs installed, checked where it runs


def dist_version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def vllm_registry_archs():
    """vLLM's in-tree architectures read from its registry's source, or None when that cannot be read.

    Importing `vllm.ModelRegistry` imports torch and most of vLLM: over a minute on a loaded 2-core host.
    The registry is literal dicts (`_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, ...}`), so parsing the file
    gives the same names without running it; find_spec of the top package alone imports nothing."""
    # A plugin from another package (vllm-ascend, ...) may register models at start-up: only the import knows.
    # vLLM's own (its LoRA resolvers, `vllm.plugins...`) register none.
    if any(not e.value.startswith("vllm.") for e in md.entry_points(group="vllm.general_plugins")):
        return None
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "model_executor", "models", "registry.py")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    dicts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    dicts[target.id] = node.value
    top = dicts.get("_VLLM_MODELS")
    if top is None:
        return None
    archs = []
    for key, value in zip(top.keys, top.values):
        if key is None and isinstance(value, ast.Name) and value.id in dicts:  # **_TEXT_GENERATION_MODELS
            archs += [k.value for k in dicts[value.id].keys if isinstance(k, ast.Constant)]
        elif isinstance(key, ast.Constant):
            archs.append(key.value)
        else:
            return None  # a layout this reader does not know: ask the import
    return archs or None


def supported_archs(kind, mimic):
    """The architectures the engine's model registry can build (the K3 class lives only in K3 images)."""
    if kind == "vllm":
        archs = vllm_registry_archs()
        if archs is not None:
            return archs
    if kind == "sglang":
        from sglang.srt.models.registry import ModelRegistry
        return list(ModelRegistry.get_supported_archs())
    if kind in ("vllm", "vllm-ascend"):
        from vllm import ModelRegistry
        return list(ModelRegistry.get_supported_archs())
    # its packages (numpy, torch, ...), which the engine's modules above do not import
    importlib.import_module(SIM_EXTRAS).require("sim", what="the stand-in engine")
    return list(importlib.import_module(SIM_MODEL_INFO).SUPPORTED_ARCHITECTURES)


def engine_version(kind, mimic):
    if kind == "sim":
        return importlib.import_module(SIM_ENGINE_ARGS).engine_version(mimic)
    return dist_version({"sglang": "sglang", "vllm": "vllm", "vllm-ascend": "vllm"}[kind])


def main():
    kind, mimic, archs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    out = {"python": platform.python_version(), "executable": sys.executable, "torch": dist_version("torch"),
           "ray": dist_version("ray"), "version": None, "known_archs": None, "error": ""}
    if kind == "vllm-ascend":
        out["plugin"] = dist_version("vllm-ascend") or dist_version("vllm_ascend")
    try:
        out["version"] = engine_version(kind, mimic)
        known = set(supported_archs(kind, mimic))
        out["known_archs"] = [a for a in archs if a in known]
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        hint = getattr(exc, "hint", None)
        out["error"] = (f"{type(exc).__name__}: {exc}" + (f"; {hint}" if hint else ""))[:500]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
