#!/usr/bin/env bash
# Make (once) the venv holding the three real routers the router tests start: smg 1.13.0 (SGLang Model
# Gateway), sglang-router 0.3.2 and vllm-router 0.1.17, from PyPI (about 350 MB). Cached at
# ${K3DEPLOY_ROUTERS_VENV:-$HOME/.cache/k3deploy/routers}; a ready marker naming the pins is written last,
# so an interrupted install is redone and a finished one is a no-op. Prints the venv's path.
# sglang-router 0.3.2 installs a console script named `smg` too (it overwrites smg 1.13.0's), so k3deploy
# starts every router as `python -m <package>.launch_router`, never by script name.
set -euo pipefail
venv="${K3DEPLOY_ROUTERS_VENV:-$HOME/.cache/k3deploy/routers}"
pins="smg==1.13.0 sglang-router==0.3.2 vllm-router==0.1.17"
marker="$venv/.k3deploy-routers-ready"
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$pins" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv"
  exit 0
fi
rm -f "$marker"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC2086  # the pins are separate words on purpose
"$venv/bin/python" -m pip install -q --disable-pip-version-check $pins >&2
for module in smg.launch_router sglang_router.launch_router vllm_router.launch_router; do
  "$venv/bin/python" -c "import importlib; importlib.import_module('$module')" >&2
done
printf '%s' "$pins" > "$marker.tmp" && mv "$marker.tmp" "$marker"
echo "$venv"
