"""The validated packaged catalog, kept between runs: `k3deploy plan` does not re-validate unchanged files."""
from __future__ import annotations

import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pydantic

import k3deploy
from k3deploy.catalog.specs import Catalog

_SOURCES = Path(__file__).parent


def cache_file() -> Path:
    """`$XDG_CACHE_HOME/k3deploy/catalog.pickle` (default `~/.cache`; a relative XDG path is ignored)."""
    root = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(root):
        root = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "k3deploy" / "catalog.pickle"


def catalog_key(files: Sequence[Path]) -> bytes:
    """Everything the validated catalog depends on: the versions, the catalog code and the YAML, verbatim."""
    parts = [f"k3deploy {k3deploy.__version__} pydantic {pydantic.VERSION} python {sys.version}".encode()]
    for path in sorted(_SOURCES.glob("*.py")) + list(files):
        parts += [path.name.encode(), path.read_bytes()]
    return b"\0".join(parts)


def _read(path: Path, key: bytes) -> Catalog | None:
    try:
        with path.open("rb") as f:
            if pickle.load(f) != key:
                return None
            catalog = pickle.load(f)
    except Exception:  # noqa: BLE001 - a missing, truncated or foreign cache file is a miss, however it fails
        return None
    return catalog if isinstance(catalog, Catalog) else None


def _write(path: Path, key: bytes, catalog: Catalog) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".catalog-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(key, f, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.dump(catalog, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)  # readers see the old file or the whole new one, never a partial write
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only or full cache directory only costs the next run a re-validation


def cached_catalog(files: Sequence[Path], validate: Callable[[], Catalog]) -> Catalog:
    """The catalog `validate()` builds from `files`, reused from the cache while its inputs are unchanged."""
    path = cache_file()
    key = catalog_key(files)
    catalog = _read(path, key)
    if catalog is None:
        catalog = validate()
        _write(path, key, catalog)
    return catalog
