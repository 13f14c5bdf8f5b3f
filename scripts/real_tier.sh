#!/usr/bin/env bash
# The real-engine tier (issue 25) as two pytest runs at once, then its wall time; called by scripts/test.sh,
# whose main run leaves these tests out (`--files` prints what to leave out).
#
# Why two at once: a real vLLM start is three fresh Python imports of torch and vLLM one after another (API
# server, engine core, worker: ~10 s of one core each), so a TP 1 start keeps one of the two cores busy and
# the tier's waits (a watch of a silent node, a rollout's drain, a fault's detection) keep none. One run
# after the other, the tier took 677 s on a quiet machine; its starts alone are most of that.
# The runs share nothing: each test makes its own rig (tests/rig/registry.py allocates names and subnets
# for concurrent runs), its own free ports and its own IPC and scratch dirs.
#
# Usage: scripts/real_tier.sh [--files]   (needs K3DEPLOY_VLLM_VENV, as scripts/test.sh exports it)
# Exit: 0 when both runs pass, else 1 (a run with no test counts as failed, as pytest's exit 5 does in CI).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The tier's modules: every test module that starts real vLLM (it takes the vllm_cache_root fixture;
# tests/unit/test_real_tier_streams.py holds this list to it), split into two runs of about the same time
# (quiet machine, one run after the other: the SSH module 403 s; tests/realengine 221 s, Ray 60 s). The
# head_dim 16 launch (one host, 28 s) moves to the second run to even them out.
SSH=tests/integration/test_real_vllm_ssh.py
MOVED="$SSH::test_a_model_that_answers_health_and_dies_on_its_first_request_is_a_failed_launch"
RUN_1=("$SSH" --deselect "$MOVED")
RUN_2=(tests/realengine tests/integration/test_real_vllm_ray.py "$MOVED")

if [ "${1:-}" = "--files" ]; then
  printf "%s\n" "$SSH" tests/realengine tests/integration/test_real_vllm_ray.py
  exit 0
fi

logs="$(mktemp -d "${TMPDIR:-/tmp}/k3deploy-real-tier.XXXXXX")"
pids=()  # set -u: the trap may fire before the first run starts
# shellcheck disable=SC2317  # run by the trap
stop_runs() {  # a Ctrl-C or CI's stop: each pytest tears down its fixtures (engines, rigs) on SIGINT
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null; done
  wait
  rm -rf "$logs"
  exit 130
}
trap stop_runs INT TERM
# Job control: each run in its own process group, so a Ctrl-C reaches a run once, through stop_runs (a second
# SIGINT during pytest's teardown would cut the teardown short), and comes in not ignored (tests/sweep.py
# also restores Python's handler where it was).
set -m

started=$SECONDS
echo "real-engine tier: two pytest runs at once (logs follow when both end)"
for n in 1 2; do
  if [ "$n" = 1 ]; then args=("${RUN_1[@]}"); else args=("${RUN_2[@]}"); fi
  # Stand-ins here join over Gloo, as the engines they are held against (tests/conftest.py says why others don't).
  K3SIM_GROUP=gloo K3DEPLOY_REAL_TIER_RUN=$n .venv/bin/python -m pytest -q -p no:cacheprovider --durations=20 "${args[@]}" \
    >"$logs/$n.log" 2>&1 &
  pids+=($!)
done
ended=("" "")
while [ -z "${ended[0]}" ] || [ -z "${ended[1]}" ]; do  # two runs: at most two turns that see one end
  wait -n || true
  for i in 0 1; do
    if [ -z "${ended[$i]}" ] && ! kill -0 "${pids[$i]}" 2>/dev/null; then ended[i]=$((SECONDS - started)); fi
  done
done
trap - INT TERM
status=0
line="real-engine tier: both runs took $((SECONDS - started)) s of wall"
for i in 0 1; do
  code=0
  wait "${pids[$i]}" || code=$?
  [ "$code" = 0 ] || status=1
  line="$line; run $((i + 1)) ended at ${ended[$i]} s (exit $code)"
  echo "=================== real-engine tier, run $((i + 1)) (exit $code) ==================="
  cat "$logs/$((i + 1)).log"
done
wall=$((SECONDS - started))
rm -rf "$logs"
install="${K3DEPLOY_VLLM_INSTALL_S:-}"
waited="${K3DEPLOY_VLLM_INSTALL_WAITED_S:-}"
if [ -n "$install" ] && [ -n "$waited" ]; then
  total=$((wall + waited))
  line="$line; venv install ${install} s, ${waited} s of it waited for (the rest ran beside the other installs,"
  line="$line the static checks and the 3.10 run); tier total ${total} s ($((total / 60)) min $((total % 60)) s)"
fi
echo "$line"
exit "$status"
