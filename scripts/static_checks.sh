#!/usr/bin/env bash
# The static step of the test script: ruff over the tree, and mypy (pydantic plugin) type-checking the
# package for the oldest Python it supports (pyproject's tool.mypy python_version: 3.10), and import-linter
# holding the package to the layers in pyproject's [tool.importlinter].
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
"$py" -m ruff check k3deploy tests bench scripts
"$py" -m mypy k3deploy
"$py" -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())' --no-cache
echo "static checks: ruff and mypy clean, import contracts kept"
