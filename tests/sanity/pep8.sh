#!/usr/bin/env bash
# ansible-test sanity's pep8 test, in seconds, for make check: the same pycodestyle (the version ansible-core's
# sanity pins, in requirements/controller.lock), the same ignore list (read from the installed ansible-test, so
# it cannot drift), the same line length, over the .py files sanity sees (what ships, plus tests/).
set -euo pipefail
bin=$(cd "${1:?usage: pep8.sh <venv bin dir>}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
sanity_root=$("$bin/python" -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_util", "controller", "sanity"))')
ignore=$(grep -vE '^\s*(#|$)' "$sanity_root/pep8/current-ignore.txt" | sort | paste -sd, -)
line_length=$(grep -A1 "'--max-line-length'" "$("$bin/python" -c 'import ansible_test._internal.commands.sanity.pep8 as m; print(m.__file__)')" \
  | grep -o "'[0-9]*'" | tr -d "'")
cd "$root"
git ls-files -z --cached --others --exclude-standard -- '*.py' | grep -zvE '^(lab|\.ci)/' \
  | xargs -0 "$bin/python" -m pycodestyle --max-line-length "${line_length:?not found in ansible-test}" --config /dev/null --ignore "$ignore"
