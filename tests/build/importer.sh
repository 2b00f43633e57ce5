#!/usr/bin/env bash
# galaxy-importer, the checks Galaxy runs on an uploaded collection, on the tarball tests/build/run.sh built
# (.cache/dist), offline: from its own venv (requirements/importer.lock; it pins its own ansible-core and
# ansible-lint), without ansible-test (its container-based check), ansible-lint offline, flake8 on.
# Fails when the importer fails or reports any ERROR or WARNING.
set -euo pipefail
ibin=$(cd "${1:?usage: importer.sh <importer venv bin dir> [tarball]}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tarball=${2:-$(find "$root/.cache/dist" -maxdepth 1 -name 'multinode-vllm-*.tar.gz' -print -quit 2>/dev/null)}
if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
  echo "importer.sh: no tarball in .cache/dist; run make build first" >&2; exit 1
fi
tarball=$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Option names: galaxy_importer/config.py (Config.DEFAULTS).
cat > "$work/galaxy-importer.cfg" <<EOF
[galaxy-importer]
run_ansible_test = False
ansible_test_local_image = False
local_image_docker = False
infra_osd = False
run_ansible_doc = True
run_ansible_lint = True
offline_ansible_lint = True
run_flake8 = True
check_changelog = True
check_required_tags = False
require_v1_or_greater = False
ansible_local_tmp = $work/ansible-tmp
tmp_root_dir = $work
EOF
cd "$work"
# Only the extracted tarball: no repo ansible.cfg, no link to the working tree; the importer venv's
# ansible-doc, ansible-lint and flake8 first on PATH. An ANSIBLE_HOME of its own: ansible-lint resolves
# multinode.vllm.* through the default collections path too, and make test's molecule scenarios reinstall this
# collection into ~/.ansible/collections while the importer runs beside them (a role's file then goes missing
# mid-lint: "load-failure[filenotfounderror] .../roles/doctor/vars/main.yml", the CI failure of stop 33).
mkdir -p "$work/ansible-home"
set +e
env -u ANSIBLE_CONFIG -u PYTHONPATH -u ANSIBLE_COLLECTIONS_PATH PATH="$ibin:$PATH" ANSIBLE_HOME="$work/ansible-home" \
  GALAXY_IMPORTER_CONFIG="$work/galaxy-importer.cfg" \
  "$ibin/python" -m galaxy_importer.main "$tarball" >"$work/importer.log" 2>&1
rc=$?
set -e
if [ "$rc" != 0 ] || grep -qE '^(ERROR|WARNING)' "$work/importer.log"; then
  cat "$work/importer.log" >&2
  echo "galaxy-importer on $(basename "$tarball"): exit $rc; errors and warnings:" >&2
  grep -E '^(ERROR|WARNING)' "$work/importer.log" | sed 's/^/  /' >&2 || true
  exit 1
fi
echo "galaxy-importer $("$ibin/python" -c 'from importlib.metadata import version; print(version("galaxy-importer"))') on" \
  "$(basename "$tarball"): $(grep -c '^Loading ' "$work/importer.log") contents loaded, no error, no warning"
