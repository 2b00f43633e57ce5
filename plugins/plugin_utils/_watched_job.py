# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The controller side both watched jobs share (actions model_hf_download and model_transfer).

Each runs its module once (``job: run``), or starts it as a detached job on the node and runs it again every
``progress_interval`` seconds (``job: status``) while ``module_utils/_progress.run_watched`` prints the lines.
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase


class WatchedJobAction(ActionBase):
    """An action that runs ``MODULE`` with a ``job`` argument; subclasses say what to print."""

    TRANSFERS_FILES = False
    MODULE = ""

    def _module(self, task_vars, args, job):
        try:
            return self._execute_module(module_name=self.MODULE, module_args=dict(args, job=job), task_vars=task_vars)
        except AnsibleError as exc:  # one status run that did not reach the node: the watch retries it
            if job != "status":
                raise
            return {"failed": True, "msg": str(exc)}

    @staticmethod
    def _interval(args) -> float:
        """Seconds between two status runs; 0 (no watch) when the value is not a number."""
        try:
            return float(args.get("progress_interval", 5))
        except (TypeError, ValueError):
            return 0.0  # the module refuses the value, naming it
