"""Pieces of README.md that tests run or check verbatim, so README and tests cannot drift apart."""
from __future__ import annotations

import re
from pathlib import Path

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
