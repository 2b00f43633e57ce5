#!/bin/sh
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# What `make demo` prints from its deploy.yml log (lab/demo-summary.sh LOG): the serve role's node table and the
# completion readiness got with its tokens/s. Role tasks print as TASK [multinode.vllm.serve : NAME]. Exits 1 when
# the log holds neither; tests/integration/test_serve.py runs it on a real deploy's output, so a renamed task cannot
# silently empty the demo's summary again.
set -eu
sed -n '/TASK \[[^]]*Show the node table\]/,/^$/p;/TASK \[[^]]*Show one completion/,/^$/p' "$1" \
  | grep -vE '^(TASK|ok:| +msg:|$)'
