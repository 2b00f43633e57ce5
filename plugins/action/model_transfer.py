# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of model_transfer: a pull's progress while it runs.

An Ansible task shows its output only when it ends; a pull of a large model takes minutes. For ``mode: pull``
(not in check mode, ``progress_interval`` above 0) this starts the pull in a detached process on the worker
(the module with ``job: start``), runs the module again every ``progress_interval`` seconds (``job: status``:
the files renamed into place and the bytes in their ``.partial`` files, measured on the worker) and prints

    spark2: model pull 37.2/119.0 GiB, 12/41 files, 1.9 GiB/s, ETA 43 s

then a summary line, and returns the pull's result as the module would have. Every worker runs this in its
own fork (the linear strategy runs a task on all hosts at once), so the workers pull in parallel and their
lines interleave, each naming its host. The loop and the wording: ``module_utils/_progress.py``.
"""

from __future__ import annotations

from ansible.utils.display import Display

from ansible_collections.multinode.vllm.plugins.module_utils._progress import (
    format_bytes,
    run_watched,
    summary_line,
)
from ansible_collections.multinode.vllm.plugins.plugin_utils._watched_job import WatchedJobAction

display = Display()
MODULE = "multinode.vllm.model_transfer"
WHAT = "model pull"


def summarize(host: str, result) -> str:
    """The summary line of a finished pull's result (what this run received)."""
    return summary_line(host, WHAT, result.get("bytes") or 0, len(result.get("received") or []),
                        result.get("seconds") or 0, "from %s" % result.get("server") if result.get("server") else "")


class ActionModule(WatchedJobAction):
    MODULE = MODULE

    def run(self, tmp=None, task_vars=None):
        self._supports_check_mode = True
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        host = str(args.get("host") or task_vars.get("inventory_hostname", ""))
        interval = self._interval(args)
        watched = args.get("mode") == "pull" and args.get("job", "run") == "run" and interval > 0
        if not watched or self._task.check_mode:
            result.update(self._module(task_vars, args, args.get("job", "run")))
            pull = args.get("mode") == "pull" and not result.get("failed")
            if pull and self._task.check_mode:
                files = args.get("files") or []
                display.display("%s: %s (check mode) would receive %d file%s, %s" % (
                    host, WHAT, len(files), "" if len(files) == 1 else "s",
                    format_bytes(sum(int(f.get("size") or 0) for f in files if isinstance(f, dict)))))
            elif pull and args.get("job", "run") == "run" and result.get("received"):
                display.display(summarize(host, result))
            return result
        result.update(run_watched(lambda job: self._module(task_vars, args, job), display.display, host, WHAT,
                                  interval, lambda final: summarize(host, final) if final.get("received") else None))
        return result
