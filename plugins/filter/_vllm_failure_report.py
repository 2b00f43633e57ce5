# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _vllm_failure_report
short_description: A failed vLLM start explained, from the log tails of every node
version_added: 0.1.0
description:
  - Finds the most likely cause in the log tails (the failure table of C(docs/serve.md); the first signature found,
    most specific first), and returns the reason, that cause with its fix, and the last lines of every log.
  - When the loop's results carry C(first_errors) (P(multinode.vllm.vllm_ready#module) with
    O(multinode.vllm.vllm_ready#module:first_errors=true)), each log's first exception is searched before its
    tail, and a generic engine failure is named by it.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description:
      - Log lines keyed by a label such as C(spark2:/var/log/multinode-vllm/ray.log); or the C(results) of a loop
        of P(multinode.vllm.vllm_ready#module) over the nodes (each with C(item), the node, and C(tails)), labelled
        C(<item>:<path>).
    type: raw
    required: true
  reason:
    description: What failed (first line of the report).
    type: str
    required: true
  lines:
    description: Lines shown per log.
    type: int
    default: 15
"""

EXAMPLES = r"""
- name: Fail with the logs a loop of vllm_ready read on every node
  ansible.builtin.fail:
    msg: "{{ node_logs.results | multinode.vllm._vllm_failure_report(reason='vllm serve exited') }}"

- name: Fail with every node's logs and the likely cause
  ansible.builtin.fail:
    msg: "{{ tails | multinode.vllm._vllm_failure_report(reason='vLLM was not ready after 600 s') }}"
"""

RETURN = r"""
_value:
  description: The report text.
  type: str
"""

from collections.abc import Mapping

from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import failure_message, likely_cause


def _labelled(tails):
    """({label: lines}, {label: first error}) from a mapping, or from a loop's results (no dict is built in Jinja:
    2.19 forbids it)."""
    if isinstance(tails, Mapping):
        return {str(k): [str(x) for x in (v or [])] for k, v in tails.items()}, {}
    out, firsts = {}, {}
    for result in tails or []:
        for path, lines in dict(result.get("tails") or {}).items():
            out["%s:%s" % (result.get("item"), path)] = [str(x) for x in (lines or [])]
        for path, error in dict(result.get("first_errors") or {}).items():
            if error:
                firsts["%s:%s" % (result.get("item"), path)] = dict(error)
    return out, firsts


def vllm_failure_report(tails, reason, lines=15):
    tails, firsts = _labelled(tails)
    return failure_message(str(reason), tails, likely_cause(tails, firsts), lines=int(lines))


class FilterModule:
    def filters(self):
        return {"_vllm_failure_report": vllm_failure_report}
