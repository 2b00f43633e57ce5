#!/bin/bash
# Install the Debian packages of the list that are not installed yet (root, apt); nothing when all are.
# Usage: apt-install-missing.sh LABEL PACKAGE... (LABEL names the make target in messages).
set -euo pipefail
label=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "$label: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "$label: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine's package lists may be stale or empty: update once and retry.
apt-get install -y --no-install-recommends "${missing[@]}" \
  || { apt-get update -qq && apt-get install -y --no-install-recommends "${missing[@]}"; }
