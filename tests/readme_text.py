"""Pieces of README.md that tests run or check verbatim, so README and tests cannot drift apart."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def section(title: str) -> str:
    """The text of the `## title` section (up to the next `## ` heading)."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 4)
    return text[start:end if end != -1 else len(text)]


def code_blocks(text: str, lang: str) -> list[str]:
    """Every fenced block of one language in `text`."""
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


def two_commands() -> list[str]:
    """README's two commands (the non-comment lines of the first sh block of "Two commands")."""
    block = code_blocks(section("Two commands (fresh Debian or Ubuntu machine, run from a clone)"), "sh")[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


class ReadmeInstall(NamedTuple):
    clone: Path  # a copy of this checkout, as a user's clone
    venv: Path  # clone/.venv, made by README's install command: the core install, no extra
    run: subprocess.CompletedProcess[str]  # README's install command itself (the install, then a plan)


SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist"}


def install_as_readme_says(tmp: Path) -> ReadmeInstall:
    """README's install command, verbatim, in a copy of the checkout under `tmp`, by a stock python3 (the one
    this venv was made from, which sees no k3deploy) first on PATH; its result is not judged here."""
    clone = tmp / "k3deploy"
    shutil.copytree(ROOT, clone, ignore=lambda _d, names: [n for n in names
                                                            if n in SKIP_DIRS or n.endswith(".egg-info")])
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "COLUMNS")}
    env["PATH"] = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    run = subprocess.run(["sh", "-c", two_commands()[0]], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=560, check=False)
    return ReadmeInstall(clone, clone / ".venv", run)
