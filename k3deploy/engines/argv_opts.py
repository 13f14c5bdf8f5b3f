"""Engine options as data: rendered flags, the user's `engine.args` merged over them, argv out."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from k3deploy.engines.flag_tables import Flag, FlagTable
from k3deploy.topology.engine import ArgValue


@dataclass(frozen=True)
class Opt:
    """One flag with its value tokens (none for a bare switch)."""

    flag: str
    values: tuple[str, ...] = ()


def opt(flag: str, *values: object) -> Opt:
    """Opt("--tp-size", 8) -> --tp-size 8."""
    return Opt(flag, tuple(str(v) for v in values))


def decimal(x: float) -> str:
    """A fraction as flag text, to 6 significant digits (stable across platforms)."""
    return f"{x:.6g}"


def word(value: str | float) -> str:
    """A flag value as the engine's argparse reads it."""
    return value if isinstance(value, str) else str(value)


def user_opt(flag: Flag, spelling: str, value: ArgValue) -> Opt | None:
    """The Opt a user's `engine.args` entry renders to (None: omit the flag)."""
    if value is None or value is False:
        return None
    if value is True:
        return Opt(spelling)
    if isinstance(value, list):
        return Opt(spelling, tuple(word(v) for v in value))
    return Opt(spelling, (word(value),))


def arg_problems(args: Mapping[str, ArgValue], table: FlagTable) -> Iterator[tuple[str, str]]:
    """(flag, reason) for every `engine.args` entry the engine's parser would reject."""
    for spelling, value in args.items():
        flag = table.get(spelling)
        if flag is None:
            yield spelling, f"{table.engine} has no flag {spelling}"
            continue
        if value is None or value is False:
            continue
        if value is True:
            if flag.takes_value and flag.nargs not in ("?", "*"):
                yield spelling, f"{spelling} takes a value; true renders it bare"
            continue
        if not flag.takes_value:
            yield spelling, f"{spelling} is a switch: use true (render it) or false (omit it)"
            continue
        values = value if isinstance(value, list) else [value]
        if len(values) != 1 and flag.nargs not in ("+", "*"):
            yield spelling, f"{spelling} takes one value, not a list"
            continue
        for v in values:
            problem = table.value_problem(flag, word(v))
            if problem:
                yield spelling, problem


def merge(opts: Iterable[Opt], args: Mapping[str, ArgValue], table: FlagTable) -> tuple[Opt, ...]:
    """The rendered options with the user's args applied: same dest replaces in place, else appends."""
    base = tuple(opts)
    out: list[Opt | None] = list(base)
    dests = [_dest(o.flag, table) for o in base]
    for spelling, value in args.items():
        flag = table.get(spelling)
        if flag is None:
            raise ValueError(f"{table.engine} has no flag {spelling}")  # plan rules report this first
        new = user_opt(flag, spelling, value)
        if flag.dest in dests:
            i = dests.index(flag.dest)
            out[i] = new
        else:
            out.append(new)
            dests.append(flag.dest)
    return tuple(o for o in out if o is not None)


def _dest(spelling: str, table: FlagTable) -> str:
    flag = table.get(spelling)
    if flag is None:
        raise ValueError(f"{table.engine} has no flag {spelling}: the renderer must only emit real flags")
    return flag.dest


def effective(opts: Iterable[Opt], table: FlagTable, dest: str) -> Opt | None:
    """The option that sets `dest` in a merged list (None: the engine's default applies)."""
    for o in opts:
        if _dest(o.flag, table) == dest:
            return o
    return None


def flatten(opts: Iterable[Opt]) -> tuple[str, ...]:
    """Options as argv tokens."""
    return tuple(tok for o in opts for tok in (o.flag, *o.values))
