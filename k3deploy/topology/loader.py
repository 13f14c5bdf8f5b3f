"""Load a topology file: every problem reported at once as file:line:col with a did-you-mean."""
from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, NamedTuple, get_args, get_origin

from pydantic import BaseModel, ValidationError

from k3deploy.diagnostics import Issue, dotted
from k3deploy.errors import InputError
from k3deploy.topology.base import no_pydantic_plugins
from k3deploy.topology.pd import pd_issues
from k3deploy.topology.replicas import replica_issues
from k3deploy.topology.schema import Topology
from k3deploy.topology.source import PathKey, SourceMap, YamlSyntaxError, load_yaml
from k3deploy.topology.units import UnitLayout, unit_layout


class LoadedTopology(NamedTuple):
    """A validated topology with the positions of its values and its unit's layout."""

    topology: Topology
    source: SourceMap
    layout: UnitLayout

    @classmethod
    def of(cls, topology: Topology, source: SourceMap) -> LoadedTopology:
        """`topology`, read from `source`, with its unit laid out once (its replicas and roles fit its nodes)."""
        return cls(topology, source, unit_layout(topology))

    @property
    def file(self) -> str:
        """The file it came from."""
        return self.source.file


class TopologyError(InputError):
    """A topology file with problems; `issues` holds every one of them.

    `partial` is the topology without the offending values (defaults in their place) when that still
    validates, so later checks can run; `unchecked` names the values left out (dotted paths)."""

    def __init__(self, file: str, issues: list[Issue], partial: LoadedTopology | None = None,
                 unchecked: frozenset[str] = frozenset()) -> None:
        self.file = file
        self.issues = issues
        self.partial = partial
        self.unchecked = unchecked
        super().__init__("\n".join(i.render(file) for i in issues))


def _suggest(word: str, options: list[str]) -> str | None:
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else None


def _model_at(path: PathKey, data: Any) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at `path` (None where there is none)."""
    model: Any = Topology
    node = data
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = _field(model, part)
        if field is None:
            return None
        node = node.get(part) if isinstance(node, dict) else None
        model = _resolve(field.annotation, node, isinstance(part, int))
        if isinstance(part, int):
            continue
        if get_origin(model) is list and isinstance(node, list):
            model = get_args(model)[0]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _field(model: type[BaseModel], part: str | int) -> Any:
    for name, f in model.model_fields.items():
        if part in (name, f.alias):
            return f
    return None


def _resolve(annotation: Any, node: Any, _indexed: bool) -> Any:
    """Strip Optional/Annotated; pick the discriminated-union member by `kind`."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin is list:
        return annotation
    if args and origin is not dict:
        members = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(members) > 1 and isinstance(node, dict):
            for m in members:
                kind = m.model_fields.get("kind")
                if kind is not None and node.get("kind") in get_args(kind.annotation):
                    return m
            return None
        if members:
            return members[0]
        for a in args:
            inner = _resolve(a, node, _indexed)
            if inner is not None:
                return inner
    return annotation


def _error_path(err: Any, data: Any, smap: SourceMap) -> PathKey:
    """Where in the document a pydantic error is, without the discriminator tags pydantic puts in
    locations (engine.sglang.port -> engine.port)."""
    loc: list[str | int] = []
    for part in err["loc"]:
        model = _model_at(tuple(loc), data)
        if isinstance(part, int) or smap.has(tuple(loc) + (part,)) or (model and _field(model, part)):
            loc.append(part)
    return tuple(loc)


def _issue_from_error(err: Any, data: Any, smap: SourceMap) -> Issue:
    path = _error_path(err, data, smap)
    kind = err["type"]
    hint = None
    if kind == "extra_forbidden":
        model = _model_at(path[:-1], data)
        options = [f.alias or n for n, f in model.model_fields.items()] if model else []
        hint = _suggest(str(path[-1]), options)
        pos = smap.locate_key(path)
        message = f"unknown key '{path[-1]}'" + (f"; allowed: {', '.join(sorted(options))}" if not hint else "")
    elif kind == "missing":
        pos = smap.locate(path[:-1])
        message = f"missing required key '{path[-1]}'"
    elif kind == "union_tag_invalid":
        tags = err.get("ctx", {}).get("expected_tags", "")
        got = err.get("ctx", {}).get("tag", "")
        options = [t.strip(" '") for t in str(tags).split(",")]
        hint = _suggest(str(got), options)
        pos = smap.locate(path + ("kind",))
        path = path + ("kind",)
        message = f"unknown engine kind '{got}'; expected one of {tags}"
    else:
        pos = smap.locate(path)
        message = err["msg"].removeprefix("Value error, ")
        if "input" in err and not isinstance(err["input"], (dict, list)) and kind != "value_error":
            message += f" (got {_shown(err['input'])})"
    return Issue(code="SCHEMA", severity="error", message=message, path=dotted(path),
                 line=pos.line, column=pos.column, hint=hint)


def _nul_issues(data: Any, smap: SourceMap, path: PathKey = ()) -> list[Issue]:
    """Strings holding a NUL: no process argument or environment value can carry one, so such a value
    would fail only on the node, mid-launch."""
    if isinstance(data, dict):
        return [i for k, v in data.items() for i in _nul_issues(v, smap, path + (k if isinstance(k, (str, int))
                                                                              else str(k),))]
    if isinstance(data, list):
        return [i for n, v in enumerate(data) for i in _nul_issues(v, smap, path + (n,))]
    if isinstance(data, str) and "\x00" in data:
        pos = smap.locate(path)
        return [Issue(code="SCHEMA", severity="error", message="contains a NUL character (\\0), which no "
                      "command argument or environment value can hold", path=dotted(path), line=pos.line,
                      column=pos.column)]
    return []


def _shown(value: object, limit: int = 80) -> str:
    """A wrong value as the message quotes it: its repr, cut short (it may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def parse_topology(text: str, file: str) -> LoadedTopology:
    """Validate YAML text as a topology; raise TopologyError with every problem."""
    try:
        data, smap, dups = load_yaml(text, file)
    except YamlSyntaxError as exc:
        issue = Issue(code="YAML", severity="error", message=f"invalid YAML: {exc}",
                      line=exc.position.line, column=exc.position.column)
        raise TopologyError(file, [issue]) from None
    issues = [
        Issue(code="DUPLICATE_KEY", severity="error", message=f"duplicate key '{p[-1]}'",
              path=dotted(p), line=pos.line, column=pos.column)
        for p, pos in dups
    ]
    if not isinstance(data, dict):
        issues.append(Issue(code="YAML", severity="error", message="a topology is a YAML mapping",
                            line=1, column=1))
        raise TopologyError(file, issues)
    issues += _nul_issues(data, smap)
    try:
        with no_pydantic_plugins():
            topology = Topology.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        issues += [_issue_from_error(e, data, smap) for e in errors]
        issues.sort(key=lambda i: (i.line or 0, i.column or 0))
        partial = _without_errors(data, [(e["type"], _error_path(e, data, smap)) for e in errors])
        if partial is None:
            raise TopologyError(file, issues) from None
        topo, left_out = partial
        _raise_mismatched(file, issues, topo, smap)
        raise TopologyError(file, issues, LoadedTopology.of(topo, smap), left_out) from None
    _raise_mismatched(file, issues, topology, smap)
    if issues:
        raise TopologyError(file, issues, LoadedTopology.of(topology, smap))
    return LoadedTopology.of(topology, smap)


def _raise_mismatched(file: str, issues: list[Issue], topology: Topology, smap: SourceMap) -> None:
    """TopologyError without a partial when replicas or roles do not fit the nodes or ports: a replica's or
    an instance's plan needs a consistent layout (also when a schema error elsewhere left a partial)."""
    mismatched = [located(i, smap) for i in (*replica_issues(topology), *pd_issues(topology))]
    if mismatched:
        raise TopologyError(file, sorted(issues + mismatched, key=lambda i: (i.line or 0, i.column or 0)))


def located(issue: Issue, smap: SourceMap) -> Issue:
    """The issue with the line and column of its dotted path (`nodes[1].ip`) in the file."""
    path: list[str | int] = []
    for part in issue.path.replace("]", "").replace("[", ".").split("."):
        if part:
            path.append(int(part) if part.isdigit() else part)
    pos = smap.locate(tuple(path))
    return issue._replace(line=pos.line, column=pos.column)


def _without_errors(data: dict[str, Any], errors: list[tuple[str, PathKey]]) -> tuple[Topology, frozenset[str]] | None:
    """The topology with every offending key removed (its default takes its place), and the paths of the
    values that were removed (an unknown key's value was never used, so it is not one of them); None
    when a required value is wrong, as nothing can stand in for it."""
    fixed = copy.deepcopy(data)
    left_out: set[str] = set()
    for kind, path in errors:
        parent: Any = fixed
        for part in path[:-1]:
            if isinstance(parent, list) and isinstance(part, int) and 0 <= part < len(parent):
                parent = parent[part]
            else:
                parent = parent.get(part) if isinstance(parent, dict) else None
        if not path or not isinstance(parent, dict) or path[-1] not in parent:
            return None
        del parent[path[-1]]
        if kind != "extra_forbidden":
            left_out.add(dotted(path))
    try:
        return Topology.model_validate(fixed), frozenset(left_out)
    except ValidationError:
        return None


def load_topology(path: Path | str) -> LoadedTopology:
    """Read and validate a topology file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TopologyError(str(path), [Issue(code="FILE", severity="error", message=f"cannot read: {reason}")]) from None
    return parse_topology(text, str(path))
