"""A deployment's effort measurements and the constants `calibrate` fitted from them, beside its record:
STATE_DIR/NAME/effort.json and STATE_DIR/NAME/calibration.json, each written atomically. Plain JSON through
the standard library, so `plan --workload` finds a cluster's calibration without loading the record models."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from k3deploy.errors import StateError
from k3deploy.planning.calibration import Calibration
from k3deploy.records.files import read_text, write_atomic

EFFORT = "effort.json"
CALIBRATION = "calibration.json"


def effort_path(state_dir: Path, name: str) -> Path:
    """The file of NAME's effort measurements."""
    return Path(state_dir) / name / EFFORT


def calibration_path(state_dir: Path, name: str) -> Path:
    """The file of NAME's fitted constants."""
    return Path(state_dir) / name / CALIBRATION


def _read(path: Path, fix: str) -> Any:
    """The JSON in `path`, None when there is no file; a StateError naming the file and `fix` otherwise."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StateError(f"{path} is not JSON: {exc}", hint=fix) from exc


def load_measurements(state_dir: Path, name: str) -> list[dict[str, Any]]:
    """NAME's effort measurements, oldest first ([] when validate never measured one)."""
    path = effort_path(state_dir, name)
    doc = _read(path, f"remove {path}, then run `k3deploy validate {name} --only effort` again")
    if doc is None:
        return []
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise StateError(f"{path} holds no list of effort runs", hint=f"remove {path}, then run `k3deploy validate "
                         f"{name} --only effort` again")
    return runs


def _key(run: dict[str, Any]) -> tuple[Any, ...]:
    w = run.get("workload", {})
    return w.get("concurrency"), w.get("input_tokens"), w.get("output_tokens"), run.get("plan_digest")


def add_measurement(state_dir: Path, name: str, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Keep `run` with NAME's measurements (replacing an earlier one of the same workload and plan); the list."""
    runs = [r for r in load_measurements(state_dir, name) if _key(r) != _key(run)] + [run]
    write_atomic(effort_path(state_dir, name), json.dumps({"deployment": name, "runs": runs}, indent=2))
    return runs


def load_calibration_doc(state_dir: Path, name: str) -> dict[str, Any] | None:
    """What `calibrate NAME` stored (the constants, the fit and every run's errors), or None."""
    path = calibration_path(state_dir, name)
    doc = _read(path, f"remove it with `k3deploy calibrate {name} --remove`")
    if doc is not None and not isinstance(doc, dict):
        raise StateError(f"{path} is not a k3deploy calibration", hint=f"remove it with `k3deploy calibrate {name} "
                         "--remove`")
    return doc


def load_calibration(state_dir: Path, name: str) -> Calibration | None:
    """NAME's fitted constants as `plan --workload` applies them, or None when it has none."""
    doc = load_calibration_doc(state_dir, name)
    if doc is None:
        return None
    try:
        return Calibration.from_json(doc["calibration"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"{calibration_path(state_dir, name)} is not a k3deploy calibration ({exc})",
                         hint=f"remove it with `k3deploy calibrate {name} --remove`, then calibrate again") from exc


def save_calibration(state_dir: Path, name: str, doc: dict[str, Any]) -> Path:
    """Store what `calibrate NAME` fitted; the file's path."""
    path = calibration_path(state_dir, name)
    write_atomic(path, json.dumps(doc, indent=2))
    return path


def remove_calibration(state_dir: Path, name: str) -> bool:
    """Forget NAME's fitted constants; whether there were any."""
    path = calibration_path(state_dir, name)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StateError(f"cannot remove {path}: {exc}") from exc
    with contextlib.suppress(OSError):  # the folder goes with its last file (logs may still be in it)
        path.parent.rmdir()
    return True
