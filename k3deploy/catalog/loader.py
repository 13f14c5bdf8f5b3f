"""Load the packaged catalog YAML, plus a user's own files from `--catalog DIR`."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from k3deploy.catalog.cache import cached_catalog
from k3deploy.catalog.specs import Catalog
from k3deploy.errors import InputError
from k3deploy.topology.base import no_pydantic_plugins
from k3deploy.topology.source import YamlSyntaxError, load_yaml

DATA_DIR = Path(__file__).parent / "data"
_LIST_SECTIONS = ("models", "hardware")
_MAP_SECTIONS = ("vendors", "engines", "planner", "performance")

try:  # the C loader is several times faster on the `plan` start-up path
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read catalog file: {exc}") from exc
    if path.parent == DATA_DIR:  # our own files: the fast loader, no positions needed
        data = yaml.load(text, Loader=_Loader)
    else:  # a user's file gets the topology loader's guards (nesting depth, alias bombs, duplicate keys)
        try:
            data, _smap, dups = load_yaml(text, str(path))
        except YamlSyntaxError as exc:
            raise InputError(f"{path}:{exc.position.line}:{exc.position.column}: invalid YAML: {exc}") from None
        if dups:
            (key, pos), *_ = dups
            raise InputError(f"{path}:{pos.line}:{pos.column}: duplicate key '{'.'.join(map(str, key))}'")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a catalog file must be a mapping with models/hardware/engines keys")
    unknown = set(data) - set(_LIST_SECTIONS) - set(_MAP_SECTIONS)
    if unknown:
        raise InputError(
            f"{path}: unknown catalog section(s) {sorted(unknown)}; "
            f"expected any of {list(_LIST_SECTIONS + _MAP_SECTIONS)}"
        )
    for section in _LIST_SECTIONS:
        if not isinstance(data.get(section) or [], list):
            raise InputError(f"{path}: `{section}` must be a list of entries with an `id`")
    for section in _MAP_SECTIONS:
        # Only an absent or null section is empty: `planner: []` is a mistake, not nothing.
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise InputError(f"{path}: `{section}` must be a mapping")
    return data


def _merge(raw: dict[str, Any], data: dict[str, Any], path: Path) -> None:
    for section in _LIST_SECTIONS:
        for i, entry in enumerate(data.get(section) or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise InputError(f"{path}: {section}[{i}] needs an `id` (a string)")
            raw[section][entry["id"]] = entry
    for section in ("vendors", "engines", "performance"):
        raw[section].update(data.get(section) or {})
    if "planner" in data:
        raw["planner"] = {**raw["planner"], **data["planner"]}


def _files(extra_dirs: tuple[Path, ...]) -> list[Path]:
    files = sorted(DATA_DIR.glob("*.yaml"))
    for d in extra_dirs:
        if not d.is_dir():
            raise InputError(f"--catalog {d}: not a directory", hint="pass a folder of *.yaml catalog files")
        files += sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml"))
    return files


@functools.lru_cache(maxsize=8)
def load_catalog(extra_dirs: tuple[Path, ...] = ()) -> Catalog:
    """The packaged catalog, with entries from `extra_dirs` added or overriding by id."""
    files = _files(extra_dirs)
    if extra_dirs:  # a user's files are validated on every run, merged with the entries they override
        return validate_catalog(files)
    return cached_catalog(files, lambda: validate_catalog(files))


def validate_catalog(files: list[Path]) -> Catalog:
    """Merge catalog files in order (later ids win) and validate the result; errors name the file."""
    raw: dict[str, Any] = {"models": {}, "hardware": {}, "vendors": {}, "engines": {}, "planner": {},
                           "performance": {}}
    origin: dict[tuple[str, str], Path] = {}
    for path in files:
        data = _read(path)
        _merge(raw, data, path)
        for section in _LIST_SECTIONS:
            for entry in data.get(section) or []:
                origin[(section, entry["id"])] = path
    try:
        with no_pydantic_plugins():
            return Catalog.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = err["loc"]
            where = origin.get((str(loc[0]), str(loc[1]))) if len(loc) > 1 else None
            dotted = ".".join(str(p) for p in loc)
            lines.append(f"{where or 'catalog'}: {dotted}: {err['msg']}")
        raise InputError("invalid catalog:\n  " + "\n  ".join(lines)) from exc
