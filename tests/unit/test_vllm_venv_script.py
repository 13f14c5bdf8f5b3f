"""scripts/vllm_cpu_venv.sh's cache: a ready venv of this release is reused without installing anything (a venv
made by the script's earlier, pip-based form carries the same marker and is accepted on purpose); a marker of
another release or a half-made venv is not ready. Only --check and the ready path run here: nothing installs."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_cpu_venv.sh"
pytestmark = pytest.mark.timeout(60)


def _venv(tmp_path: Path, marker: str | None, bytecode: bool = True) -> Path:
    venv = tmp_path / "vllm-venv"
    (venv / "bin").mkdir(parents=True)
    vllm = venv / "bin" / "vllm"
    vllm.write_text("#!/bin/sh\nexit 3\n")
    vllm.chmod(0o755)
    if marker is not None:
        (venv / ".k3deploy-ready").write_text(marker)
    if bytecode:
        (venv / ".k3deploy-bytecode").write_text("0.32.0\n")
    return venv


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "K3DEPLOY_VLLM_VENV": str(venv)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30,
                          check=False)


@pytest.mark.parametrize("args", [(), ("--check",)])
def test_a_ready_venv_of_this_release_is_reused_as_it_is(tmp_path: Path, args: tuple[str, ...]) -> None:
    # The marker exactly as the old script wrote it: print() of the alias's version, newline included.
    venv = _venv(tmp_path, "0.32.0+cpu\n")
    before = sorted(p.name for p in venv.rglob("*"))
    done = _run(venv, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(venv)]
    assert sorted(p.name for p in venv.rglob("*")) == before


def test_a_ready_venv_without_byte_code_is_compiled_once(tmp_path: Path) -> None:
    """A venv made before the script compiled everything gets its .pyc once (every start pays for a missing
    one where PYTHONDONTWRITEBYTECODE is set), then is reused as it is."""
    venv = _venv(tmp_path, "0.32.0+cpu\n", bytecode=False)
    calls = tmp_path / "calls"
    python = venv / "bin" / "python"  # records its arguments; answers the purelib query with a path
    python.write_text(f"#!/bin/sh\necho \"$*\" >>{calls}\necho {venv}/lib\n")
    python.chmod(0o755)
    assert _run(venv, "--check").returncode == 0 and not calls.exists()  # --check changes nothing
    done = _run(venv)
    assert done.returncode == 0 and done.stdout.splitlines() == [str(venv)], done.stderr
    assert f"-m compileall -q -j 0 {venv}/lib" in calls.read_text()
    assert (venv / ".k3deploy-bytecode").read_text() == "0.32.0\n"
    calls.unlink()
    assert _run(venv).returncode == 0 and not calls.exists()  # once


@pytest.mark.parametrize("marker", ["0.31.1+cpu\n", None])
def test_a_venv_of_another_release_or_unfinished_is_not_ready(tmp_path: Path, marker: str | None) -> None:
    venv = _venv(tmp_path, marker)
    done = _run(venv, "--check")
    assert done.returncode == 1
    assert f"not ready: {venv} (run scripts/vllm_cpu_venv.sh)" in done.stderr
    assert done.stdout == ""
