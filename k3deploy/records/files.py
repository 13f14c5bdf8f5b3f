"""Where records live and how a record file is written: the state directory, and atomic writes (temp file in
the same directory, fsync, rename; mode 0600). Standard library only, so `plan` can look for a cluster's
calibration without loading the record models."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from k3deploy.errors import StateError

if TYPE_CHECKING:
    from k3deploy.topology.schema import Topology


def default_state_dir() -> Path:
    """$XDG_STATE_HOME/k3deploy, else ~/.local/state/k3deploy."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "k3deploy"


def state_dir_of(topology: Topology, state_dir: Path | str | None = None) -> Path:
    """Where a topology's records live: `state_dir` (a command's option), else its launch.state_dir, else the
    user's state directory (`default_state_dir`)."""
    return Path(state_dir or topology.launch.state_dir or default_state_dir()).expanduser()


def write_atomic(target: Path, text: str) -> None:
    """Write `text` to `target` atomically (its directory made 0700 if missing); the old file stays whole on
    failure, and the StateError names the file."""
    import tempfile  # here, not at the top: `plan` reads records through this module and never writes one

    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise StateError(f"cannot write {target}: {exc}") from exc
    try:
        with os.fdopen(fd, "w") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StateError(f"cannot write {target}: {exc}") from exc


def read_text(path: Path) -> str | None:
    """The file's text, None when there is no file; a StateError naming it when it cannot be read."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc}") from exc
