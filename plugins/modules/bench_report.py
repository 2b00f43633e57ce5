#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: bench_report
short_description: Write vLLM's serving benchmark results and their tables into a results directory on the controller
version_added: 0.1.0
description:
  - Runs on the controller only (an action plugin; nothing runs on the task's host).
  - Writes each run of M(multinode.vllm.serve_bench) as C(<dir>/raw/<label>-c<concurrency>-i<input>-o<output>.json)
    (vLLM's own result JSON, without the generated texts), merges the summary rows into C(<dir>/results.json) (a row
    of the same label and case from an earlier run is replaced, other labels are kept), and writes
    C(<dir>/results.md) - the table of every row (TTFT, TPOT, ITL p50/p99, output tokens/s, requests/s), the fabric
    figures (O(preflight_proof)'s all-reduce line, O(tcp)), and, when the directory holds several labels, the side-by-side table (C(docs/bench.md)).
  - Refuses, before writing anything, a C(results.json) that is not this module's.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every run rewrites the files of its label with the new figures.
options:
  runs:
    description: The C(runs) M(multinode.vllm.serve_bench) returned.
    type: list
    elements: dict
    required: true
  dir:
    description: The results directory on the controller (created).
    type: path
    required: true
  preflight_proof:
    description: The head's distributed preflight proof file, parsed (its all-reduce line goes into the table); null
      when there is none.
    type: raw
  tcp:
    description: The links M(multinode.vllm.fabric_throughput) measured from the head.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Write the results and the tables on the controller
  multinode.vllm.bench_report:
    runs: "{{ bench_runs.runs }}"
    dir: "{{ playbook_dir }}/bench-results"
    preflight_proof: null
    tcp: []
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
table:
  description: The text of C(results.md).
  returned: success
  type: str
rows:
  description: Every summary row of C(results.json) after this run.
  returned: success
  type: list
  elements: dict
path:
  description: The path of C(results.md).
  returned: success
  type: str
"""
