#!/usr/bin/env bash
# The docs: antsibull-docs' lint of the collection's plugin and role docs, then the docs site built with
# antsibull-docs (one page per plugin and role) and Sphinx (-W: a warning fails), offline.
# Site: docs/site (conf.py, index.rst) + docs/*.md (the guides, MyST) + the generated pages -> .cache/docs-site.
set -euo pipefail
docs_bin=$(cd "${1:?usage: run.sh <docs venv bin dir> <controller venv bin dir>}" && pwd)
controller_bin=$(cd "${2:?usage: run.sh <docs venv bin dir> <controller venv bin dir>}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
src=$root/.cache/docs-src
site=${DOCS_SITE:-$root/.cache/docs-site}
cd "$root"

# antsibull-docs runs ansible-doc and ansible-galaxy from the docs venv. The collection is found through its link
# under .cache/collections (make setup); the collections it depends on (galaxy.yml), which ansible-doc loads too,
# through the controller venv's pinned `ansible` package, so nothing is fetched.
deps=$("$controller_bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export PATH=$docs_bin:$PATH
export ANSIBLE_COLLECTIONS_PATH=$root/.cache/collections:$deps
[ -e "$root/.cache/collections/ansible_collections/multinode/vllm/galaxy.yml" ] \
  || { echo "run.sh: the collection is not linked under .cache/collections (run make setup)" >&2; exit 1; }

echo "== antsibull-docs lint-collection-docs --plugin-docs"
antsibull-docs lint-collection-docs --plugin-docs .

echo "== antsibull-docs collection (rst) + docs/*.md -> $src"
rm -rf "$src" && mkdir "$src" && chmod 700 "$src"  # antsibull-docs wants it writable by its owner only
antsibull-docs --config-file docs/site/antsibull-docs.cfg collection --use-current --fail-on-error \
  --dest-dir "$src" multinode.vllm
cp -r docs/site/. "$src/"
cp docs/*.md docs/*.svg "$src/"
mkdir -p "$src/dev-notes" && cp docs/dev-notes/*.md "$src/dev-notes/"

echo "== sphinx-build -W -> $site"
rm -rf "$site" "$root/.cache/docs-doctrees"
sphinx-build -b html -W --keep-going -n -q -E -d "$root/.cache/docs-doctrees" "$src" "$site"

# Offline means offline for the reader too: no page loads a script, stylesheet or font from the network.
if grep -rlE '<(script|link|img)[^>]+(src|href)="(https?:)?//' "$site" --include='*.html'; then
  echo "run.sh: the pages above load something from the network" >&2
  exit 1
fi
echo "docs: lint clean, site in $site (open $site/index.html)"
