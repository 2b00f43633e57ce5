#!/usr/bin/env bash
# Build the collection tarball, install it into a fresh collections path (no Galaxy access:
# --no-deps, the community collections come from the pinned `ansible` package), check that the
# installed copy holds no developer file (build_ignore in galaxy.yml), and that ansible-doc
# renders every module and filter from it. The tarball stays in .cache/dist for `make importer`.
set -euo pipefail
bin=$(cd "${1:?usage: run.sh <venv bin dir>}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
dist=$root/.cache/dist
cd "$root"
mkdir -p "$dist" && rm -f "$dist"/multinode-vllm-*.tar.gz
"$bin/ansible-galaxy" collection build --force --output-path "$dist" . >/dev/null
tarball=$(ls "$dist"/multinode-vllm-*.tar.gz)
echo "built $(basename "$tarball") ($(du -h "$tarball" | cut -f1))"
# A fresh path, away from the repo's ansible.cfg and its link to the working tree.
export ANSIBLE_COLLECTIONS_PATH="$out/collections"
unset ANSIBLE_CONFIG PYTHONPATH
cd "$out"
"$bin/ansible-galaxy" collection install --no-deps -p "$out/collections" "$tarball" >/dev/null
# What a user gets: only the collection's content. Anything else (Makefile, lock files, the lab inventory,
# lab/bench/GPU/integration tests, repo configs, caches) is a developer file that build_ignore must leave out.
installed=$out/collections/ansible_collections/multinode/vllm
shipped='^(README\.md|LICENSE|CHANGELOG\.md|MANIFEST\.json|FILES\.json|(meta|plugins|roles|playbooks|docs|changelogs|tests/unit)/.+|tests/sanity/ignore-[0-9.]+\.txt)$'
dev='(^|/)(Makefile|[^/]*\.lock|requirements|inventories|lab|\.venv|\.lab|\.cache|\.hypothesis|\.pytest_cache|__pycache__|[^/]*\.pyc|\.gitignore|\.ansible-lint|ansible\.cfg|pytest\.ini|\.plugin-cache\.yaml)(/|$)'
files=$(cd "$installed" && find . -mindepth 1 ! -type d -printf '%P\n' | LC_ALL=C sort)
bad=$({ grep -vE "$shipped" <<<"$files"; grep -E "$dev" <<<"$files"; } | LC_ALL=C sort -u || true)
if [ -n "$bad" ]; then
  echo "the installed collection holds developer files (add them to build_ignore in galaxy.yml):" >&2
  mapfile -t bad_files <<<"$bad"
  printf '  %s\n' "${bad_files[@]}" >&2; exit 1
fi
echo "installed file list: $(wc -l <<<"$files") files, no developer file"
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
