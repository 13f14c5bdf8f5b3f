"""Optional dependencies: the extra that brings each one, and a missing one as a user error with its install.

The core install (`pip install -e .`) plans, renders and prints the schema; everything else imports its
library where it is used. The CLI (and the stand-in's entry point) turn the ImportError that escapes into
MissingDependency here, so no command needs its own try/except around an import.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from k3deploy.errors import MissingDependency

# Top-level module -> (distribution to name, extra of pyproject.toml that installs it).
OPTIONAL = {
    "numpy": ("numpy", "sim"),
    "torch": ("torch", "sim"),
    "safetensors": ("safetensors", "sim"),
    "prometheus_client": ("prometheus_client", "sim"),
    "tokenizers": ("tokenizers", "sim"),
    "paramiko": ("paramiko", "ssh"),
    "ray": ("ray", "ray"),
    "junitparser": ("junitparser", "validate"),
    "jsonschema": ("jsonschema", "validate"),
    "huggingface_hub": ("huggingface_hub", "hub"),
    "matplotlib": ("matplotlib", "report"),
    "lm_eval": ("lm-eval", "accuracy"),
    "tenacity": ("lm-eval", "accuracy"),
}
# Dependencies of the core install: missing, the install itself is broken.
CORE = ("httpx", "typer", "pydantic", "yaml", "rich", "typing_extensions")
_NAMED = re.compile(r"No module named '?([\w.]+)'?")


def _module(exc: ImportError) -> str | None:
    """The top-level module an ImportError is about (its `name`, else the one its message names)."""
    name = exc.name
    if not name:
        found = _NAMED.search(str(exc))
        name = found.group(1) if found else None
    return name.split(".")[0] if name else None


def _source_tree() -> Path | None:
    """The checkout this package runs from (an editable install, or a clone on sys.path), if any."""
    root = Path(__file__).resolve().parent.parent
    try:
        return root if 'name = "k3deploy"' in (root / "pyproject.toml").read_text(encoding="utf-8") else None
    except OSError:
        return None


def _shown(path: Path) -> str:
    """A path as short as it can be written from here (relative below the working directory)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def install_command(extra: str) -> str:
    """The exact command that adds `extra` to the installation running now."""
    pip_path = Path(sys.executable).parent / "pip"
    pip = _shown(pip_path) if pip_path.exists() else f"{sys.executable} -m pip"
    tree = _source_tree()
    spec = "." if tree is not None and _shown(tree) == "." else _shown(tree) if tree is not None else "k3deploy"
    if tree is not None:
        return f"{pip} install -e '{spec}[{extra}]'" if extra else f"{pip} install -e '{spec}'"
    return f"{pip} install 'k3deploy[{extra}]'" if extra else f"{pip} install k3deploy"


def missing_dependency(exc: ImportError) -> MissingDependency | None:
    """The user error for an ImportError of an optional (or core) dependency; None for anything else
    (a module of k3deploy itself that will not import is a bug, not a missing install)."""
    module = _module(exc)
    if module in OPTIONAL:
        dist, extra = OPTIONAL[module]
        broken = isinstance(exc, ModuleNotFoundError) or "No module named" in str(exc)
        what = (f"this needs {dist}, which is not installed" if broken
                else f"{dist} is installed but does not import ({exc}); reinstall it")
        return MissingDependency(f"{what} (it comes with k3deploy's '{extra}' extra)",
                                 hint=f"install it: {install_command(extra)}", module=module)
    if module in CORE:
        return MissingDependency(f"k3deploy's install is incomplete: {exc}",
                                 hint=f"reinstall it: {install_command('')}", module=module)
    return None


def require(*extras: str, what: str) -> None:
    """Raise MissingDependency naming every package of these extras that is not installed here, before
    `what` starts (so a user installs once, not once per module)."""
    missing = [dist for module, (dist, extra) in OPTIONAL.items()
               if extra in extras and importlib.util.find_spec(module) is None]
    if missing:
        spec = ",".join(extras)
        extra = f"'{spec}' extras" if len(extras) > 1 else f"'{spec}' extra"
        raise MissingDependency(f"{what} needs {', '.join(missing)}, not installed here (k3deploy's {extra})",
                                hint=f"install them: {install_command(spec)}", module=missing[0])
