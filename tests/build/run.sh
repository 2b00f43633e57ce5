#!/usr/bin/env bash
# Build the collection tarball, install it into a fresh collections path (no Galaxy access:
# --no-deps, the community collections come from the pinned `ansible` package), and check
# that ansible-doc renders every module and filter from the installed copy.
set -euo pipefail
bin=$(cd "${1:?usage: run.sh <venv bin dir>}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$root"
"$bin/ansible-galaxy" collection build --force --output-path "$out/dist" . >/dev/null
tarball=$(ls "$out"/dist/multinode-vllm-*.tar.gz)
echo "built $(basename "$tarball") ($(du -h "$tarball" | cut -f1))"
if tar -tzf "$tarball" | grep -qE '(^|/)(\.venv|\.lab|\.cache|lab)/'; then
  echo "tarball contains lab, venv or cache files" >&2; exit 1
fi
# A fresh path, away from the repo's ansible.cfg and its link to the working tree.
export ANSIBLE_COLLECTIONS_PATH="$out/collections"
unset ANSIBLE_CONFIG PYTHONPATH
cd "$out"
"$bin/ansible-galaxy" collection install --no-deps -p "$out/collections" "$tarball" >/dev/null
for module in "$root"/plugins/modules/*.py; do
  name=$(basename "$module" .py)
  "$bin/ansible-doc" -t module "multinode.vllm.$name" | grep -q "multinode.vllm.$name" \
    || { echo "ansible-doc cannot render module $name" >&2; exit 1; }
done
for filter in "$root"/plugins/filter/*.py; do
  name=$(basename "$filter" .py)
  "$bin/ansible-doc" -t filter "multinode.vllm.$name" | grep -q "multinode.vllm.$name" \
    || { echo "ansible-doc cannot render filter $name" >&2; exit 1; }
done
"$bin/ansible-doc" -t role -l multinode.vllm | grep -q "multinode.vllm.fabric" \
  || { echo "installed collection lists no fabric role" >&2; exit 1; }
echo "installed into a fresh collections path; ansible-doc renders every module, filter and role"
