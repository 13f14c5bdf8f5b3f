#!/usr/bin/env bash
# The static step of the test script: ruff over the tree, and mypy (pydantic plugin) type-checking the
# package for the oldest Python it supports (pyproject's tool.mypy python_version: 3.10).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
"$py" -m ruff check k3deploy tests bench scripts
"$py" -m mypy k3deploy
echo "static checks: ruff and mypy clean"
