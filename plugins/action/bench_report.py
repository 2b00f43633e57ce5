# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side only: serve_bench's runs -> the raw JSON, results.json and results.md of the results directory.
Nothing runs on any node."""

from __future__ import annotations

import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.module_utils._bench import (
    BenchError,
    allreduce_line,
    load_rows,
    markdown,
    merge_rows,
)


def _write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("runs", "dir", "preflight_proof", "tcp"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        runs = args.get("runs")
        extras = {"allreduce": allreduce_line(args.get("preflight_proof")), "tcp": list(args.get("tcp") or [])}
        directory = os.path.abspath(os.path.expanduser(str(args.get("dir") or "").strip() or "."))
        if not isinstance(runs, list) or not all(isinstance(r, dict) and "row" in r and "name" in r for r in runs):
            raise AnsibleActionFail("bench_report: runs must be the runs serve_bench returned; got %r" % (runs,))
        results_json = os.path.join(directory, "results.json")
        try:
            earlier = []
            if os.path.exists(results_json):
                with open(results_json) as handle:
                    earlier = load_rows(handle.read(), results_json)
            rows = merge_rows(earlier, [r["row"] for r in runs])
            table = markdown(rows, extras)
        except BenchError as exc:
            raise AnsibleActionFail(str(exc))
        os.makedirs(os.path.join(directory, "raw"), exist_ok=True)
        for run in runs:
            _write(os.path.join(directory, "raw", run["name"] + ".json"),
                   json.dumps(run.get("result") or {}, indent=2, sort_keys=True) + "\n")
        _write(results_json, json.dumps({"rows": rows, "extras": extras}, indent=2, sort_keys=True) + "\n")
        path = os.path.join(directory, "results.md")
        _write(path, table)
        result.update(changed=True, table=table, rows=rows, path=path,
                      msg="bench: %d case(s) written to %s" % (len(runs), directory))
        return result
