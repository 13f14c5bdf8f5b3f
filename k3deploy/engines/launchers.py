"""engine.launcher: which launcher form of the engine it is, and the argv prefix that form needs.

The forms and how each takes the model come from the flag tables (read off the engines' code by
scripts/engine_flag_tables.py); the stand-in has one form of its own.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from k3deploy.engines.flag_tables import FlagTable, Form, Positional
from k3deploy.engines.kinds import Family

SIM_MODULE = "k3deploy.sim"
SIM_FORM = Form(name=f"python -m {SIM_MODULE} serve", script=None, modules=(SIM_MODULE,), subcommand=("serve",),
                model="positional", positionals=(Positional("model_path", "?"),), required=(), headless=True)


@dataclass(frozen=True)
class Launcher:
    """A resolved launcher: the argv before the model, its form, and whether the form was recognised."""

    prefix: tuple[str, ...]
    form: Form
    known: bool


def _complete(words: tuple[str, ...], form: Form) -> tuple[str, ...] | None:
    """`words` as a launcher of `form` (its subcommand appended when missing), None if it is not one."""
    for i, word in enumerate(words):
        if form.script is not None and PurePosixPath(word).name == form.script:
            rest = words[i + 1:]
        elif word == "-m" and i + 1 < len(words) and words[i + 1] in form.modules:
            rest = words[i + 2:]
        else:
            continue
        if rest[:len(form.subcommand)] == form.subcommand:
            return words
        if not rest:  # a bare console script or module: its serve subcommand is implied
            return (*words, *form.subcommand)
    return None


def default_prefix(form: Form) -> tuple[str, ...]:
    """The argv a form starts with when the topology names no launcher."""
    if form.script is not None:
        return (form.script, *form.subcommand)
    return ("python3", "-m", form.modules[0], *form.subcommand)


def _with_mimic(prefix: tuple[str, ...], family: Family) -> tuple[str, ...]:
    # The stand-in cannot start without knowing whose flags it parses.
    return prefix if "--mimic" in prefix else (*prefix, "--mimic", family)


def resolve_launcher(launcher: Sequence[str] | None, kind: str, table: FlagTable, family: Family) -> Launcher:
    """The form of `engine.launcher` (default: the engine's console script); unknown ones are kept as given."""
    sim = kind == "sim"
    forms = (SIM_FORM,) if sim else table.forms
    if not launcher:
        prefix = default_prefix(forms[0])
        return Launcher(_with_mimic(prefix, family) if sim else prefix, forms[0], True)
    words = tuple(launcher)
    for form in forms:
        found = _complete(words, form)
        if found is not None:
            return Launcher(_with_mimic(found, family) if sim else found, form, True)
    return Launcher(words, forms[0], False)


def model_how(form: Form) -> str:
    """How a form takes the model, for messages and docs."""
    return "as the first argument" if form.model == "positional" else f"with {form.model}"
