"""README.md is usable as written: its commands, its example, its exit codes, its references."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.errors import EXIT_CODES
from k3deploy.planning.files import plan_path
from tests.k3deploy_cli import run_k3deploy
from tests.readme_text import README, ROOT, code_blocks, section, two_commands

pytestmark = pytest.mark.timeout(60)
TEXT = README.read_text(encoding="utf-8")


def test_install_uses_a_project_venv_not_the_system_pip() -> None:
    install, test = two_commands()
    assert install.startswith("python3 -m venv .venv && ") and ".venv/bin/pip install -q -e ." in install
    assert install.endswith(".venv/bin/k3deploy plan topologies/h100-4x8-sglang.yaml")
    assert test == "bash scripts/test.sh"
    assert "python3 -m pip" not in TEXT and "pip install" not in TEXT.replace(".venv/bin/pip install", "")
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "python3 -m venv" in script and ".venv/bin/python -m pip install" in script
    assert "python3 -m pip" not in script and "python3-venv" in script
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert ".venv/" in (ROOT / ".gitignore").read_text().splitlines()


def test_topology_example_plans_feasible_as_is(tmp_path: object) -> None:
    block = code_blocks(section("Topology file"), "yaml")[0]
    doc = yaml.safe_load(block)
    shipped = yaml.safe_load((ROOT / "topologies" / "h100-4x8-sglang.yaml").read_text())
    assert doc == shipped  # the README shows the shipped file, all of it
    f = ROOT / "topologies" / "h100-4x8-sglang.yaml"
    assert plan_path(f, load_catalog()).exit_code == 0
    assert "leading `--` included" in section("Topology file")


def test_readme_refers_only_to_files_in_the_repository() -> None:
    assert "../" not in TEXT and "STYLE.md" not in TEXT
    tops = {p.name for p in ROOT.iterdir()}
    for token in re.findall(r"`([^`\s]+)`", TEXT):
        path = token.split(":")[0].rstrip(".,")
        if "/" in path and path.split("/")[0] in tops and "*" not in path:
            assert (ROOT / path).exists(), token


def test_every_exit_code_is_documented_including_70() -> None:
    table = section("Commands")
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    assert 70 in EXIT_CODES and documented == set(EXIT_CODES), documented
    help_text = run_k3deploy("--help", timeout_s=30, environ={"COLUMNS": "200", "PATH": "/usr/bin"}).stdout
    assert "70 a bug in k3deploy" in help_text


def test_curl_asks_for_the_model_name_the_demo_serves() -> None:
    flow = section("The whole flow on one machine (stand-in engine)")
    body = re.search(r"-d '(\{.*?\})'", flow, flags=re.DOTALL)
    assert body is not None
    model = json.loads(body.group(1))["model"]
    rendered = run_k3deploy("render", "topologies/local-demo.yaml", "--node", "0", timeout_s=30).stdout
    served = re.search(r"--served-model-name (\S+)", rendered)
    assert served is not None and served.group(1) == model == "kimi-k3-tiny"
    assert ".venv/bin/k3deploy launch topologies/local-demo.yaml" in flow
