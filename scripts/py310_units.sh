#!/usr/bin/env bash
# The unit tier under Python 3.10 (the oldest pyproject.toml promises), in its own venv .venv310, made once
# and reinstalled only when pyproject.toml changes. Python 3.10 comes from PATH (python3.10) or pyenv; where
# there is none this step says so and skips. Every extra is installed except torch: the only torch wheel on
# these machines is for 3.11, and `torch==2.13.0` for 3.10 from PyPI is a multi-GB CUDA build, so the unit
# tests that need torch skip under 3.10 (tests/conftest.py; they ran under the main venv).
set -euo pipefail
cd "$(dirname "$0")/.."

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
  echo "unit tier under Python 3.10: SKIPPED: no python3.10 on PATH or under pyenv (pyenv install 3.10)"
  exit 0
fi

[ -x .venv310/bin/python ] || "$py310" -m venv .venv310
stamp=".venv310/k3deploy-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  # Every extra but torch, read from pyproject.toml (tomllib is 3.11+: the 3.10 venv has none).
  mapfile -t reqs < <(.venv/bin/python - <<'PY'
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
echo "unit tier under $(.venv310/bin/python --version) (.venv310, no torch)"
PATH="$PWD/.venv310/bin:$PATH" .venv310/bin/python -m pytest -q -p no:cacheprovider tests/unit
