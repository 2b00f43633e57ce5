# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side only: every node's doctor_collect result -> the diagnosis and the bundle.

Assembles doctor's ``collected`` (``_doctor.collected``: an SSH-unreachable host becomes ``ssh_unreachable``),
diagnoses it with the failure table (``_diagnosis.report``, which redacts after diagnosing, with the inventory's
secrets and every one it harvests), writes ``<dir>/doctor-<cluster>-<UTC timestamp>.tar.gz`` and returns the
``symptom -> cause -> fix`` lines, most likely first. Nothing runs on any node.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.module_utils._doctor import (
    DoctorError,
    build,
    secret_values,
    write_bundle,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("cluster", "results", "secrets", "dir", "cluster_name"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        cluster, results = args.get("cluster"), args.get("results")
        if not isinstance(cluster, dict) or not isinstance(results, dict):
            raise AnsibleActionFail("doctor_report: cluster and results must be dicts (results: host -> the "
                                    "registered doctor_collect result); got %s and %s"
                                    % (type(cluster).__name__, type(results).__name__))
        directory = str(args.get("dir") or "").strip()
        if not directory:
            raise AnsibleActionFail("doctor_report: dir is empty; set doctor_dir to a directory on the controller")
        when = datetime.now(timezone.utc)
        try:
            name, report, files = build(cluster, results, secret_values(args.get("secrets") or []),
                                        str(args.get("cluster_name") or ""), when)
            path = write_bundle(directory, name, files)
        except DoctorError as exc:
            raise AnsibleActionFail(str(exc))
        result.update(changed=False, path=path, lines=report["lines"], findings=report["findings"],
                      errors=report["errors"], msg="doctor: %d finding(s); bundle %s" % (len(report["findings"]), path))
        return result
