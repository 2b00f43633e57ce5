#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: node_files
short_description: Put a node's directories and small rendered files in place in one round trip
version_added: 0.1.0
description:
  - Creates O(directories) and writes O(files) (content rendered on the controller), each with its mode, as the user
    the module runs as (root), atomically, and only when the content or mode differs.
  - One module run instead of a C(file)/C(copy) pair per path, which keeps an idempotent deploy fast.
  - Check mode reports what would change and writes nothing; diff mode shows each changed file.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  directories:
    description: Directories to create, C({path, mode}).
    type: list
    elements: dict
    default: []
  files:
    description: Files to write, C({path, content, mode}); the parent directory must exist or be listed in O(directories).
    type: list
    elements: dict
    default: []
  secret_files:
    description:
      - Like O(files), for secrets (a token, a key). Their content is masked in every output (no_log) and never
        shown in a diff; write them with mode 0600.
    type: list
    elements: dict
    default: []
  absent:
    description: Files to remove when present (after the writes), e.g. a program the node no longer runs.
    type: list
    elements: path
    default: []
"""

EXAMPLES = r"""
- name: Write the env file
  multinode.vllm.node_files:
    directories: [{path: /etc/multinode-vllm, mode: "0755"}]
    files: [{path: /etc/multinode-vllm/node.env, content: "VLLM_HOST_IP=198.18.200.12\n", mode: "0600"}]
"""

RETURN = r"""
changed_paths:
  description: The paths created or rewritten (or that would be).
  returned: always
  type: list
  elements: str
"""

import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _mode(value, path):
    try:
        return int(str(value), 8)
    except ValueError:
        raise ValueError("%s: mode must be octal like '0644'; got %r" % (path, value))


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[]),
            files=dict(type="list", elements="dict", default=[]),
            secret_files=dict(type="list", elements="dict", default=[], no_log=True),
            absent=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    changed = []
    diffs = []
    try:
        for entry in module.params["directories"]:
            path, mode = entry["path"], _mode(entry.get("mode", "0755"), entry["path"])
            if not os.path.isdir(path):
                changed.append(path)
                if not module.check_mode:
                    os.makedirs(path, mode=mode, exist_ok=True)
                    os.chmod(path, mode)
            elif stat.S_IMODE(os.stat(path).st_mode) != mode:
                changed.append(path)
                if not module.check_mode:
                    os.chmod(path, mode)
        entries = [(e, False) for e in module.params["files"]] + [(e, True) for e in module.params["secret_files"]]
        for entry, secret in entries:
            path, mode = entry["path"], _mode(entry.get("mode", "0644"), entry["path"])
            content = str(entry.get("content", "")).encode("utf-8")
            before = _read(path)
            if before == content and stat.S_IMODE(os.stat(path).st_mode) == mode:
                continue
            changed.append(path)
            if module._diff and before != content and not secret:
                diffs.append(dict(before_header=path, after_header=path,
                                  before=(before or b"").decode("utf-8", "replace"), after=content.decode("utf-8")))
            if module.check_mode:
                continue
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".multinode-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(content)
                os.chmod(tmp, mode)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        for path in module.params["absent"]:
            if os.path.lexists(path):
                changed.append(path)
                if module._diff:
                    diffs.append(dict(before_header=path, after_header="(absent)", before="(present)\n", after=""))
                if not module.check_mode:
                    os.unlink(path)
    except (OSError, ValueError, KeyError) as exc:
        module.fail_json(msg="could not write %s: %s" % (changed[-1] if changed else "node files", exc),
                         changed_paths=changed)
    result = dict(changed=bool(changed), changed_paths=changed)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
