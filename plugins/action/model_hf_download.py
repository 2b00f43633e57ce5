# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of model_hf_download: the download's progress while it runs.

Starts the download in a detached process on the head (the module with ``job: start``), runs the module again
every ``progress_interval`` seconds (``job: status``: the bytes of the revision's files in the Hugging Face
cache, measured on the head) and prints

    spark1: model download 37.2/119.0 GiB, 12/41 files, 210.4 MiB/s, ETA 7 min 12 s

then a summary line, and returns the download's result. No argument of the task carries the token (the
download sources it from ``token_file``), so nothing here needs ``no_log``. The loop and the wording:
``module_utils/_progress.py``; the messages of a failure: ``module_utils/_hf.py``.
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
MODULE = "multinode.vllm.model_hf_download"
WHAT = "model download"


def summarize(host: str, repo: str, result) -> str:
    """The last line of a finished (or, in check mode, planned) download."""
    if result.get("cached"):
        return "%s: %s: %s is in the cache already, nothing to download" % (host, WHAT, repo)
    if result.get("would_download") is not None:
        missing = result["would_download"]
        return "%s: %s (check mode) would fetch %d file%s, %s of %s" % (
            host, WHAT, missing.get("files", 0), "" if missing.get("files") == 1 else "s",
            format_bytes(missing.get("bytes", 0)), repo)
    return summary_line(host, WHAT, result.get("bytes") or 0, result.get("files") or 0, result.get("seconds") or 0,
                        "%s at %s" % (repo, str(result.get("commit") or "")[:12]) if result.get("commit") else repo)


class ActionModule(WatchedJobAction):
    MODULE = MODULE

    def run(self, tmp=None, task_vars=None):
        self._supports_check_mode = True
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        host = str(args.get("host") or task_vars.get("inventory_hostname", ""))
        repo = str(args.get("repo_id") or "")
        interval = self._interval(args)
        if args.get("job", "run") != "run" or interval <= 0 or self._task.check_mode:
            result.update(self._module(task_vars, args, args.get("job", "run")))
            if args.get("job", "run") == "run" and not result.get("failed"):
                display.display(summarize(host, repo, result))
            return result
        result.update(run_watched(lambda job: self._module(task_vars, args, job), display.display, host, WHAT,
                                  interval, lambda final: summarize(host, repo, final)))
        return result
