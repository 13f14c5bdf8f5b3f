"""YAML with positions: every value's file:line:col, so errors point at the offending text."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NamedTuple

import yaml

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader

PathKey = tuple[str | int, ...]
# A topology is a few levels deep and a few hundred values; far past these is a hostile or broken file:
# libyaml's composer recurses per level (a deep enough file crashes the interpreter) and aliases let a
# few lines expand to billions of values ("billion laughs").
MAX_DEPTH = 64
MAX_VALUES = 50_000
MAX_CHARS = 2**20
_INT_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 4300)() or 4300
_INT_LIMIT = 10**_INT_DIGITS


class Position(NamedTuple):
    """1-based line and column in a file."""

    line: int
    column: int


class SourceMap(NamedTuple):
    """Positions of every key and value of one YAML document, by path (filled in while parsing)."""

    file: str
    positions: dict[PathKey, Position]
    key_positions: dict[PathKey, Position]

    def locate(self, path: PathKey) -> Position:
        """The position of `path`, or of its closest existing ancestor."""
        p = tuple(path)
        while p:
            if p in self.positions:
                return self.positions[p]
            p = p[:-1]
        return self.positions.get((), Position(1, 1))

    def locate_key(self, path: PathKey) -> Position:
        """The position of the key that introduces `path` (for unknown-key errors)."""
        return self.key_positions.get(tuple(path)) or self.locate(path)

    def has(self, path: PathKey) -> bool:
        """True when `path` exists in the document."""
        return tuple(path) in self.positions


class YamlSyntaxError(Exception):
    """A YAML document that does not parse, with its position."""

    def __init__(self, message: str, position: Position) -> None:
        super().__init__(message)
        self.position = position


def _pos(mark: Any) -> Position:
    return Position(mark.line + 1, mark.column + 1)


def _construct(loader: Any, node: yaml.Node) -> Any:
    """One scalar (or key) as Python; a number Python refuses to read is a located input error."""
    text = str(node.value) if isinstance(node, yaml.ScalarNode) else ""
    shown = text if len(text) <= 40 else f"{text[:12]}...{text[-4:]} ({len(text):,} characters)"
    try:
        value = loader.construct_object(node, deep=True)
    except ValueError as exc:
        if "digits" not in str(exc):  # e.g. a date that does not exist (2026-13-45): YAML 1.1 timestamps
            raise YamlSyntaxError(f"cannot read {shown!r}: {exc} (quote it to make it a string)",
                                  _pos(node.start_mark)) from None
        value = _INT_LIMIT
    # int() refuses decimal text past sys.get_int_max_str_digits() (4,300 digits by default, against
    # quadratic-time conversion), and a hex or octal one that long reads but then cannot be printed in a
    # message: no topology or catalog value needs a fraction of that.
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INT_LIMIT:
        raise YamlSyntaxError(f"the integer {shown} has more than the {_INT_DIGITS:,} digits Python reads; "
                              "no setting needs one this large", _pos(node.start_mark))
    return value


def _walk(node: yaml.Node, loader: Any, path: PathKey, smap: SourceMap, dups: list[tuple[PathKey, Position]]) -> Any:
    if len(smap.positions) >= MAX_VALUES:
        raise YamlSyntaxError(f"the document holds more than {MAX_VALUES:,} values (a topology has hundreds; "
                              "nested aliases?)",
                              _pos(node.start_mark))
    smap.positions[path] = _pos(node.start_mark)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _construct(loader, key_node)
            if isinstance(key, (list, dict)):  # `? [a]: b` or a stray comma in flow style: YAML allows it, we cannot
                kind = "list" if isinstance(key, list) else "mapping"
                raise YamlSyntaxError(f"a key here is a {kind}, not a name (a misplaced ':' or ','?)",
                                      _pos(key_node.start_mark))
            child = path + (key if isinstance(key, (str, int)) else str(key),)
            if key in out:
                dups.append((child, _pos(key_node.start_mark)))
            smap.key_positions[child] = _pos(key_node.start_mark)
            out[key] = _walk(value_node, loader, child, smap, dups)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, loader, path + (i,), smap, dups) for i, item in enumerate(node.value)]
    return _construct(loader, node)


def _syntax_error(exc: yaml.MarkedYAMLError) -> YamlSyntaxError:
    """Point at the construct that is left open (an unclosed '{' or quote) when the parser only noticed on
    a later line: the mistake is where it started, not where the parser gave up."""
    problem, context = exc.problem_mark, exc.context_mark
    pos = _pos(problem) if problem is not None else Position(1, 1)
    opened = exc.context is not None and ("flow" in exc.context or "quoted" in exc.context)
    if context is None or problem is None or context.line >= problem.line or not opened:
        return YamlSyntaxError(f"{exc.problem or exc}", pos)
    return YamlSyntaxError(f"{exc.problem} at line {pos.line} column {pos.column}, {exc.context} that starts "
                           "here (is its closing bracket or quote missing?)", _pos(context))


def _check_depth(text: str) -> None:
    """Refuse a document nested deeper than MAX_DEPTH before anything recursive sees it (events are flat)."""
    loader = _Loader(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlSyntaxError(f"nested more than {MAX_DEPTH} levels deep", _pos(event.start_mark))
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    finally:
        loader.dispose()


def load_yaml(text: str, file: str) -> tuple[Any, SourceMap, list[tuple[PathKey, Position]]]:
    """Parse one YAML document; return data, positions and duplicate keys."""
    smap = SourceMap(file, {}, {})
    if len(text) > MAX_CHARS:
        raise YamlSyntaxError(f"{len(text):,} characters; a topology or catalog file is at most {MAX_CHARS:,}",
                              Position(1, 1))
    try:
        _check_depth(text)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc) from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(str(exc), Position(1, 1)) from exc
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, smap, []
        dups: list[tuple[PathKey, Position]] = []
        data = _walk(node, loader, (), smap, dups)
        return data, smap, dups
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc) from exc
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(str(exc), Position(1, 1)) from exc
    finally:
        loader.dispose()


def read_text(path: Path) -> str:
    """Read a topology file as UTF-8."""
    return path.read_text(encoding="utf-8")
