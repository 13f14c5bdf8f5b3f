"""scripts/real_tier.sh runs the real-engine tier as two pytest runs at once and scripts/test.sh's main run
leaves its files out: a module that starts real vLLM but is missing from that list would run in neither's
place of record (it would run in the main pass, one start after another, beside nothing), and a listed path
that is gone would leave a test out of every run."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_tier.sh"
pytestmark = pytest.mark.timeout(60)


def _tier_paths() -> list[str]:
    out = subprocess.run(["bash", str(SCRIPT), "--files"], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.split()


def _starts_real_vllm(path: Path) -> bool:
    """A function of the module (a test or a fixture) takes the vllm_cache_root fixture."""
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(a.arg == "vllm_cache_root" for a in node.args.args + node.args.kwonlyargs)
               for node in ast.walk(tree))


def test_every_module_that_starts_real_vllm_is_in_the_tier_runs_and_every_listed_path_exists() -> None:
    listed = _tier_paths()
    assert listed and all((ROOT / p).exists() for p in listed), listed
    # Every module: a fixture that starts real vLLM may live beside the tests that use it (realengine/vllm_pair).
    starters = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py") if _starts_real_vllm(p))
    assert starters, "no module takes vllm_cache_root: the check reads the wrong thing"
    outside = [s for s in starters if not any(s == p or s.startswith(p.rstrip("/") + "/") for p in listed)]
    assert outside == [], f"modules that start real vLLM missing from scripts/real_tier.sh: {outside}"


def test_the_test_moved_to_the_second_run_exists_where_the_script_says() -> None:
    text = SCRIPT.read_text()
    moved = re.search(r'^MOVED="\$SSH::(\w+)"$', text, re.MULTILINE)
    ssh = re.search(r"^SSH=(\S+)$", text, re.MULTILINE)
    assert moved and ssh, "scripts/real_tier.sh no longer names SSH and MOVED as this test reads them"
    tree = ast.parse((ROOT / ssh.group(1)).read_text())
    assert moved.group(1) in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, moved.group(1)
