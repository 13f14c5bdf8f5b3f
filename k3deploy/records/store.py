"""Records on disk: one JSON file per record (atomic writes, 0600) and a lock beside it."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from k3deploy.errors import StateError
from k3deploy.records.deployment import Deployment
from k3deploy.records.files import read_text, state_dir_of, write_atomic
from k3deploy.records.record import Record

if TYPE_CHECKING:
    from k3deploy.topology.schema import Topology

AnyRecord = TypeVar("AnyRecord", bound=Record)


def _flock(fd: int, name: str, deadline: float) -> None:
    """Take the exclusive lock on `fd`, polling until `deadline`."""
    for _ in range(100_000):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StateError(f"deployment {name} is locked by another k3deploy process") from None
            time.sleep(0.02)
    raise StateError(f"deployment {name} is locked by another k3deploy process")


class StateStore:
    """Deployment records in one directory; every read-modify-write happens under the record's lock."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory).expanduser()

    @classmethod
    def of(cls, topology: Topology, state_dir: Path | str | None = None) -> StateStore:
        """The store of a topology's records (`state_dir_of`)."""
        return cls(state_dir_of(topology, state_dir))

    def path(self, name: str) -> Path:
        """The record file of a deployment."""
        return self.directory / f"{name}.json"

    def logs_dir(self, name: str) -> Path:
        """Where local copies of node logs are kept."""
        return self.directory / name / "logs"

    def _ensure(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create state directory {self.directory}: {exc}") from exc

    @contextlib.contextmanager
    def lock(self, name: str, timeout_s: float = 30.0) -> Iterator[None]:
        """Exclusive lock of one record (fcntl, so it dies with its holder). A lock file that guards no
        record when the holder is done (`stop` of a name never launched) is removed."""
        self._ensure()
        path = self.directory / f"{name}.lock"
        deadline = time.monotonic() + timeout_s
        fd = self._acquire(path, name, deadline)
        try:
            yield
        finally:
            if not self.path(name).exists():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # while still held: a waiter then sees a removed file and opens a new one
            os.close(fd)  # closing the descriptor releases the lock

    @staticmethod
    def _acquire(path: Path, name: str, deadline: float) -> int:
        """A descriptor holding the lock on `path`, re-opening when the file was removed while we waited."""
        for _ in range(1000):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise StateError(f"cannot lock deployment {name}: {path}: {exc}") from exc
            try:
                _flock(fd, name, deadline)
                try:  # one stat: the path may be removed (by a later holder of a newer file) at any moment
                    current = os.stat(path)
                except FileNotFoundError:
                    current = None
                if current is not None and os.path.samestat(os.fstat(fd), current):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise StateError(f"deployment {name}: its lock file keeps being replaced")

    def load(self, name: str) -> Deployment | None:
        """The record, or None if there is none."""
        return self.read(name, Deployment)

    def read(self, name: str, model: type[AnyRecord], kind: str = "deployment") -> AnyRecord | None:
        """The `model` record (a `kind` record, for the error) in NAME.json, or None if there is none."""
        text = read_text(self.path(name))
        if text is None:
            return None
        try:
            return model.model_validate_json(text)
        except ValidationError as exc:
            raise StateError(f"{self.path(name)} is not a k3deploy {kind} record: {exc}") from exc

    def require(self, name: str) -> Deployment:
        """The record, or a StateError listing the known deployments."""
        dep = self.load(name)
        if dep is None:
            known = ", ".join(sorted(p.stem for p in self.directory.glob("*.json"))) or "none"
            raise StateError(f"no deployment named {name} in {self.directory} (known: {known})",
                             hint="pass the topology file or --state-dir where it was launched")
        return dep

    def save(self, dep: Deployment) -> None:
        """Write the record atomically (write)."""
        self.write(dep.name, dep)

    def write(self, name: str, record: Record) -> None:
        """Write NAME.json atomically (records/files.py); mode 0600."""
        self._ensure()
        write_atomic(self.path(name), record.model_dump_json(indent=2))

    def update(self, name: str, change: Callable[[Deployment], Deployment]) -> Deployment:
        """Load, change and save under the lock; returns the saved record."""
        with self.lock(name):
            dep = self.require(name)
            new = change(dep)
            self.save(new)
            return new
