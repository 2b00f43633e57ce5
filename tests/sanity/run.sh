#!/usr/bin/env bash
# ansible-test sanity on a copy of the collection under ansible_collections/multinode/vllm/.
# ansible-test needs that layout; the repo root is the collection, so copy what git would ship.
set -euo pipefail
bin=$(cd "${1:?usage: run.sh <venv bin dir>}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
# Outside the repo: inside it, ansible-test would ask the enclosing git repo which files exist.
work=${SANITY_WORKDIR:-/var/tmp/multinode-vllm-sanity}
dest=$work/ansible_collections/multinode/vllm
rm -rf "$dest" && mkdir -p "$dest"
# Tracked and untracked-but-not-ignored files: exactly what a commit would hold.
# lab/ and .ci/ are build_ignore'd developer tooling, not shipped: sanity covers what ships, plus tests/.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) \
  | grep -zvE '^(lab|\.ci)/' \
  | (cd "$root" && xargs -0 -I{} find {} -maxdepth 0 -type f -print0) \
  | (cd "$root" && xargs -0 cp --parents -t "$dest")
cd "$dest"
# Offline pip bootstrap for ansible-test's sanity venvs (see get_pip_offline.py).
pip_version=$("$bin/python" -c 'from ansible_test._internal.python_requirements import get_venv_packages as g
from ansible_test._internal.python_requirements import PythonConfig' >/dev/null 2>&1; \
  grep -ho "pip='[0-9.]*'" "$("$bin/python" -c 'import ansible_test,os;print(os.path.dirname(ansible_test.__file__))')"/_internal/python_requirements.py | head -n1 | cut -d"'" -f2)
pip_version=${pip_version:-24.2}
cache=$HOME/.ansible/test/cache
wheels=$root/.cache/pip-wheel
mkdir -p "$cache" "$wheels"
wheel=$(find "$wheels" -maxdepth 1 -name "pip-$pip_version-*.whl" -print -quit)
if [ -z "$wheel" ]; then
  "$bin/pip" download -q --no-deps --only-binary=:all: -d "$wheels" "pip==$pip_version"
  wheel=$(find "$wheels" -maxdepth 1 -name "pip-$pip_version-*.whl" -print -quit)
  [ -n "$wheel" ] || { echo "run.sh: pip $pip_version wheel not found in $wheels after download" >&2; exit 1; }
fi
sed "s|@PIP_WHEEL@|$wheel|" "$root/tests/sanity/get_pip_offline.py" > "$cache/get_pip_${pip_version//./_}.py"
# --venv: ansible-test installs its pinned sanity tools in its own venvs (PyPI is reachable);
# no container engine is needed. Python 3.11 is the controller and target Python here.
# ANSIBLE_TEST_COMMAND=units runs `ansible-test units` on the same copy instead (make matrix);
# SANITY_WORKDIR keeps one copy per ansible-core version apart.
"$bin/ansible-test" "${ANSIBLE_TEST_COMMAND:-sanity}" --venv --python 3.11 --color no "${@:2}"
