"""The pinned engines' flag tables (engines/data/*.json): flags, values, choices, launcher forms.

Generated from the engines' real parsers by scripts/engine_flag_tables.py; never edit them by hand.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3deploy.engines.kinds import Family

DATA_DIR = Path(__file__).parent / "data"
TableName = Family  # one table per CLI family: vLLM-Ascend keeps vLLM's, the stand-in copies one
TABLE_FILES: dict[TableName, str] = {"sglang": "sglang-0.5.23.json", "vllm": "vllm-0.33.0.json"}
# vLLM validates these names at start-up against its registries, not in argparse.
_REGISTRY_DESTS = ("reasoning_parser", "tool_call_parser")
_INT_TYPES = ("int",)
_FLOAT_TYPES = ("float",)
# Both engines accept 128k / 1M style integers for these.
_HUMAN_INT = re.compile(r"\d+(\.\d+)?[kKmMgGtT]?")
_HUMAN_TYPES = {"human_readable_int": _HUMAN_INT,
                "human_readable_int_or_auto": re.compile(r"auto|" + _HUMAN_INT.pattern)}


@dataclass(frozen=True)
class Flag:
    """One argparse argument: every spelling, where it lands, whether it takes a value."""

    flags: tuple[str, ...]
    dest: str
    takes_value: bool
    type: str | None
    nargs: str | None
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class Positional:
    """A positional argument a launcher form's parser takes; `first`: only as the first argument."""

    dest: str
    nargs: str
    first: bool = False


@dataclass(frozen=True)
class Form:
    """One way of starting the engine (`sglang serve`, `python -m sglang.launch_server`, ...)."""

    name: str
    script: str | None
    modules: tuple[str, ...]
    subcommand: tuple[str, ...]
    model: str  # "positional", or the flag that carries the model path
    positionals: tuple[Positional, ...]
    required: tuple[str, ...]
    headless: bool | None  # vLLM: whether this entry point honours --headless

    def model_argv(self, path: str) -> tuple[str, ...]:
        """The model path as this form takes it."""
        return (path,) if self.model == "positional" else (self.model, path)


@dataclass(frozen=True)
class FlagTable:
    """One engine version's argument parser, by spelling and by dest, and its launcher forms."""

    engine: str
    by_flag: dict[str, Flag]
    by_dest: dict[str, Flag]
    registries: dict[str, tuple[str, ...]]
    forms: tuple[Form, ...] = ()

    def get(self, flag: str) -> Flag | None:
        """The argument a spelling belongs to (None: the engine has no such flag)."""
        return self.by_flag.get(flag)

    def allowed(self, flag: Flag) -> tuple[str, ...] | None:
        """Choices argparse enforces, or the start-up registry for parser names."""
        if flag.choices is not None:
            return flag.choices
        return self.registries.get(flag.dest)

    def value_problem(self, flag: Flag, value: str) -> str | None:
        """Why `value` is not accepted for `flag` (None when it is)."""
        allowed = self.allowed(flag)
        if allowed is not None and value not in allowed:
            return f"'{value}' is not one of {flag.flags[0]}'s choices"
        if flag.type in _INT_TYPES and not _parses(int, value):
            return f"{flag.flags[0]} takes an integer, not '{value}'"
        if flag.type in _FLOAT_TYPES and not _parses(float, value):
            return f"{flag.flags[0]} takes a number, not '{value}'"
        human = _HUMAN_TYPES.get(flag.type or "")
        if human is not None and not human.fullmatch(value):
            return f"{flag.flags[0]} takes an integer like 131072 or 128k, not '{value}'"
        return None


def _parses(kind: type, value: str) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


def _form(raw: dict[str, Any]) -> Form:
    return Form(name=raw["name"], script=raw.get("script"), modules=tuple(raw["modules"]),
                subcommand=tuple(raw["subcommand"]), model=raw["model"],
                positionals=tuple(Positional(p["dest"], p["nargs"], bool(p.get("first")))
                                  for p in raw["positionals"]),
                required=tuple(raw["required"]), headless=raw.get("headless"))


@functools.lru_cache(maxsize=4)
def flag_table(name: TableName) -> FlagTable:
    """Load one packaged flag table."""
    raw = json.loads((DATA_DIR / TABLE_FILES[name]).read_text(encoding="utf-8"))
    by_flag: dict[str, Flag] = {}
    by_dest: dict[str, Flag] = {}
    for a in raw["arguments"]:
        choices = a.get("choices")
        f = Flag(flags=tuple(a["flags"]), dest=a["dest"], takes_value=bool(a["takes_value"]),
                 type=a.get("type"), nargs=a.get("nargs"),
                 choices=tuple(str(c) for c in choices) if choices is not None else None)
        by_dest.setdefault(f.dest, f)
        for spelling in f.flags:
            by_flag[spelling] = f
    regs = raw.get("registries", {})
    registries = {d: tuple(regs[d]) for d in _REGISTRY_DESTS if isinstance(regs.get(d), list)}
    return FlagTable(engine=raw["engine"], by_flag=by_flag, by_dest=by_dest, registries=registries,
                     forms=tuple(_form(f) for f in raw.get("forms", ())))
