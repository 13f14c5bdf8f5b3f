#!/usr/bin/env bash
# Install everything the suite needs on a fresh Debian machine (as root), then run every test tier.
# Used by the README's test command and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=""
  for bin in /usr/sbin/sshd /usr/bin/shellcheck /usr/sbin/ip /usr/bin/nsenter; do
    [ -x "$bin" ] || missing=1
  done
  if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client iproute2 shellcheck util-linux procps >/dev/null
  fi
fi

python3 -m pip install -q --disable-pip-version-check -e '.[all,dev]'
exec python3 -m pytest -q -p no:cacheprovider "$@"
