#!/usr/bin/env bash
# Unit tests under Python 3.10 (the oldest pyproject.toml promises), in its own venv .venv310, made once
# and reinstalled only when pyproject.toml changes. Python 3.10 comes from PATH (python3.10) or pyenv; where
# there is none this step says so and skips. Every extra is installed except torch: the only torch wheel on
# these machines is for 3.11, and `torch==2.13.0` for 3.10 from PyPI is a multi-GB CUDA build, so the unit
# tests that need torch skip under 3.10 (tests/conftest.py; they ran under the main venv).
#
# Usage: scripts/py310_units.sh [--install]   (--install: make or refresh .venv310 only, run nothing; scripts/test.sh
# runs it beside the main venv's install, each keeping one core busy)
set -euo pipefail
cd "$(dirname "$0")/.."
install_only=""
[ "${1:-}" = "--install" ] && install_only=1

py310=""
pyenv_root="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"
for cand in "$(command -v python3.10 || true)" "$pyenv_root"/versions/3.10.*/bin/python3.10; do
  # a pyenv shim on PATH runs only where pyenv's version selection includes 3.10: try each candidate
  if [ -x "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
    py310="$cand"
    break
  fi
done
if [ -z "$py310" ]; then
  [ -z "$install_only" ] || exit 0  # the run says why
  echo "unit tier under Python 3.10: SKIPPED: no python3.10 on PATH or under pyenv (pyenv install 3.10)"
  exit 0
fi

[ -x .venv310/bin/python ] || "$py310" -m venv .venv310
stamp=".venv310/k3deploy-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  # Every extra but torch, read from pyproject.toml (tomllib is 3.11+: the 3.10 venv has none).
  # python3 3.11+ has tomllib; else the main venv's python (made first when this runs alone).
  reader=python3
  "$reader" -c 'import tomllib' 2>/dev/null || reader=.venv/bin/python
  mapfile -t reqs < <("$reader" - <<'PY'
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
for req in sorted({r for name, reqs in extras.items() if name != "torch" for r in reqs}):
    if not req.startswith("torch"):
        print(req)
PY
)
  .venv310/bin/python -m pip install -q --disable-pip-version-check -e . "${reqs[@]}"
  echo "$want" > "$stamp"
fi
[ -z "$install_only" ] || exit 0
# What can differ under 3.10 (issue 35): every module's import and every command's --help (a 3.11-only name
# or syntax anywhere), the CLI, the topology loader and its errors, the catalog, the records and the report
# models (pydantic and typing at run time), rendering. The rest of the unit tier runs under the main venv; mypy
# (python_version 3.10) checks the whole package against 3.10's standard library.
SUBSET=(
  tests/unit/test_every_module_imports.py tests/unit/test_plan_cli.py tests/unit/test_render_cli.py
  tests/unit/test_cli_gaps.py tests/unit/test_cli_connection_options.py tests/unit/test_validate_cli.py
  tests/unit/test_topology_errors.py tests/unit/test_input_limits.py tests/unit/test_catalog.py
  tests/unit/test_examples.py tests/unit/test_state.py tests/unit/test_records_status.py
  tests/unit/test_records_locate.py tests/unit/test_render_golden.py tests/unit/test_verdicts.py
  tests/unit/test_failure_catalog.py
)
echo "unit tests under $(.venv310/bin/python --version) (.venv310, no torch): ${#SUBSET[@]} modules"
PATH="$PWD/.venv310/bin:$PATH" .venv310/bin/python -m pytest -q -p no:cacheprovider "${SUBSET[@]}"
