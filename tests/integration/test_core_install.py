"""Every command of the CLI in a venv holding only the core install (`pip install -e .`, no extras), with
inputs that reach the optional imports: each ends in its documented code, a missing package as exit 6
naming the package and the exact install, never exit 70 or a traceback.

The venv is the one README's install command made in a copy of the checkout (the `readme_install` fixture
of tests/integration/conftest.py, which test_readme_install.py checks): one install a run serves both
modules; it needs the package index pip is configured with.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from k3deploy.errors import EXIT_CODES
from tests.readme_text import ReadmeInstall

pytestmark = pytest.mark.timeout(900)
DEMO = Path(__file__).resolve().parents[2] / "topologies" / "local-demo.yaml"
MISSING = 6
# pyproject's extras, as a user reads them: the package a message must name -> the extra that brings it.
EXTRA_OF = {"numpy": "sim", "torch": "sim", "safetensors": "sim", "prometheus_client": "sim", "tokenizers": "sim",
            "paramiko": "ssh", "ray": "ray", "junitparser": "validate", "jsonschema": "validate",
            "huggingface_hub": "hub"}


@pytest.fixture(scope="module")
def core(readme_install: ReadmeInstall) -> Path:
    """The core-only venv, checked to hold none of the optional packages."""
    made = readme_install.run
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    venv = readme_install.venv
    check = f"import importlib.util as u; print([m for m in {sorted(EXTRA_OF)!r} if u.find_spec(m)])"
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", check],
                           capture_output=True, text=True, timeout=60, check=True)
    assert probe.stdout.strip() == "[]", f"the core venv holds optional packages: {probe.stdout}"
    return venv


def checkout(core: Path) -> Path:
    """The clone the core venv's editable install is of (what its messages tell the user to `pip install -e`)."""
    return core.parent


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint (made by this interpreter, which has the sim extra) and a local topology on free ports."""
    from k3deploy.sim.checkpoint import write_checkpoint
    from tests.ports import free_ports

    d = tmp_path_factory.mktemp("core")
    write_checkpoint(d / "kimi-k3-tiny")
    doc = yaml.safe_load(DEMO.read_text())
    http, dist = free_ports(2)
    doc["name"] = f"k3core-{os.getpid()}"
    doc["model"]["path"] = str(d / "kimi-k3-tiny")
    doc["engine"]["port"] = http
    doc["launch"].update(port=dist, log_dir=str(d / "logs"), state_dir=str(d / "state"), ready_timeout_s=60,
                         stop_grace_s=3)
    (d / "demo.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


class Run(NamedTuple):
    code: int
    text: str


def k3(core: Path, work: Path, *args: str, module: str | None = None) -> Run:
    """`k3deploy ARGS` (or `python -m MODULE ARGS`) from the core venv, in the work folder."""
    argv = ([str(core / "bin" / "python"), "-m", module] if module else [str(core / "bin" / "k3deploy")])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "K3DEPLOY_DEBUG")}
    env["XDG_STATE_HOME"] = str(work / "xdg")
    run = subprocess.run([*argv, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    text = run.stdout + run.stderr
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert run.returncode in EXIT_CODES and run.returncode != 70, text[-3000:]
    return Run(run.returncode, text)


def assert_missing(run: Run, core: Path, *extras: str) -> None:
    """Exit 6, naming a package of `extras` and the pip of the core venv installing exactly them."""
    assert run.code == MISSING, run.text[-3000:]
    wanted = {dist for dist, extra in EXTRA_OF.items() if extra in extras}
    assert any(d in run.text for d in wanted), run.text
    assert f"{core}/bin/pip install -e '{checkout(core)}[{','.join(extras)}]'" in run.text, run.text


def test_core_commands_run_and_missing_extras_are_named(core: Path, work: Path) -> None:
    topo = str(work / "demo.yaml")
    for args in (["--help"], ["--version"], ["plan", topo], ["plan", "--check", topo], ["plan", "--json", topo],
                 ["plan", "--search", "--hardware", "h100-80gb", "--gpus", "32"], ["schema"],
                 ["render", topo], *(["render", topo, "--format", f] for f in ("json", "script", "slurm", "lws")),
                 ["launch", "--dry-run", topo], ["launch", "--dry-run", topo, "--executor", "ssh"],
                 ["manifest", "create", str(work / "kimi-k3-tiny")]):
        assert k3(core, work, *args).code == 0, args
    assert_missing(k3(core, work, "demo", "--dir", str(work / "demo")), core, "sim", "validate")
    assert not (work / "demo" / "kimi-k3-tiny").exists()  # refused before it wrote anything
    assert_missing(k3(core, work, "make-checkpoint", str(work / "x"), module="k3deploy.sim"), core, "sim")
    assert_missing(k3(core, work, "manifest", "from-hub", "moonshotai/Kimi-K3", "--revision", "0" * 40), core, "hub")
    for executor, extra in (("ssh", "ssh"), ("ray", "ray")):
        assert_missing(k3(core, work, "preflight", topo, "--executor", executor), core, extra)
        assert_missing(k3(core, work, "launch", topo, "--executor", executor, "--skip-preflight"), core, extra)
    assert_missing(k3(core, work, "preflight", topo, "--junit", str(work / "p.xml")), core, "validate")
    assert_missing(k3(core, work, "validate", topo, "--junit", str(work / "v.xml")), core, "validate")


def test_core_launch_of_the_stand_in_names_the_sim_extra(core: Path, work: Path) -> None:
    topo = str(work / "demo.yaml")
    pre = k3(core, work, "preflight", topo)  # the engine check runs the stand-in's interpreter: this one
    assert pre.code == 1 and f"{core}/bin/pip install -e '{checkout(core)}[sim]'" in pre.text, pre.text[-3000:]
    refused = k3(core, work, "launch", topo)
    assert refused.code == 4 and "preflight failed, nothing was started" in refused.text, refused.text[-3000:]
    assert "[sim]" in refused.text
    started = k3(core, work, "launch", topo, "--skip-preflight")  # the nodes start and exit at once, saying why
    assert started.code == 4 and "exited with status 6" in started.text, started.text[-3000:]
    assert f"{core}/bin/pip install -e '{checkout(core)}[sim]'" in started.text, started.text[-3000:]
    assert k3(core, work, "status", topo).code == 4
    assert "this needs" in k3(core, work, "logs", topo, "-n", "5").text
    assert k3(core, work, "stop", topo).code == 0


@pytest.fixture
def serving(work: Path) -> Iterator[str]:
    """The topology launched by this interpreter (which has the stand-in's packages); stopped after."""
    topo = str(work / "demo.yaml")
    full = [sys.executable, "-m", "k3deploy"]
    run = subprocess.run([*full, "launch", topo, "--skip-preflight"], capture_output=True, text=True, timeout=300,
                         check=False, cwd=work)
    try:
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        yield topo
    finally:
        subprocess.run([*full, "stop", topo], capture_output=True, timeout=120, check=False, cwd=work)


def test_core_validate_of_a_serving_deployment_names_the_validate_extra(core: Path, work: Path,
                                                                         serving: str) -> None:
    assert k3(core, work, "status", serving).code == 0
    assert_missing(k3(core, work, "validate", serving, "--only", "short"), core, "validate")
