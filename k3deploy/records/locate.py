"""NAME or FILE: a deployment's (or service's) name, or the topology file it is launched from, and where its
records are: the one resolver of status, logs, stop, rollout and validate."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.errors import InputError
from k3deploy.records.files import default_state_dir
from k3deploy.records.store import StateStore

if TYPE_CHECKING:
    from k3deploy.topology.schema import Topology


@dataclass(frozen=True)
class Located:
    """Where a unit's records are and its name; with a file given, the file and its topology."""

    store: StateStore
    name: str
    file: Path | None = None
    topology: Topology | None = None


def load_topology_file(path: Path) -> Topology:
    """The topology in `path`, or an InputError naming the file (unreadable, or every problem in it)."""
    from k3deploy.topology.loader import TopologyError, load_topology

    try:
        return load_topology(path).topology
    except TopologyError as exc:
        raise InputError(f"{path} is not a valid topology:\n{exc}") from exc


def locate(name_or_file: str, state_dir: str | None) -> Located:
    """A topology file (its name, and its launch.state_dir unless `state_dir`) or a name (in `state_dir`, else
    the default state directory)."""
    path = Path(name_or_file)
    try:  # a path under a directory we may not enter: is_file() raises instead of saying False
        is_file = path.suffix in (".yaml", ".yml") or path.is_file()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    if not is_file:
        return Located(StateStore(state_dir or default_state_dir()), name_or_file)
    topology = load_topology_file(path)
    return Located(StateStore.of(topology, state_dir), topology.name, path, topology)
