#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: doctor_report
short_description: Diagnose what doctor collected on every node and write the bundle, on the controller
version_added: 0.1.0
description:
  - Runs on the controller only (an action plugin; nothing runs on the task's host).
  - Assembles the cluster's collected facts from every host's registered M(multinode.vllm.doctor_collect) result (a
    host SSH could not reach is reported as such, with Ansible's message), applies every rule of the failure table
    that verify, the preflights and readiness share, and returns the findings as C(symptom -> cause -> fix) lines,
    most likely first.
  - Redacts after diagnosing - O(secrets), every value held under a secret-looking key and every token-shaped string
    is replaced by C(<redacted>) in the findings and in every file of the bundle.
  - Writes C(<dir>/doctor-<cluster_name>-<UTC timestamp>.tar.gz) (mode 0600) - C(diagnosis.txt), C(diagnosis.json),
    C(cluster.json), one C(nodes/<host>.json) per node and the log tails under C(logs/<host>/) (C(docs/doctor.md)).
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Runs the same in check mode; the bundle is written on the controller, nothing changes on a node.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every run writes a new bundle named by its time.
options:
  cluster:
    description: The cluster part of the collected facts (head, hosts with fabric_ip and mgmt_ip, fabric_cidr, ports...).
    type: dict
    required: true
  results:
    description: Host -> the result its M(multinode.vllm.doctor_collect) task registered (unreachable ones included).
    type: dict
    required: true
  secrets:
    description: Values to redact wherever they appear (the API key, the values of vllm_secret_env, a token).
    type: list
    elements: str
    default: []
  dir:
    description: The directory on the controller the bundle is written to (made 0700 when missing).
    type: str
    required: true
  cluster_name:
    description: The cluster's name in the bundle's file name.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Diagnose and write the bundle
  multinode.vllm.doctor_report:
    cluster: "{{ doctor_cluster }}"
    results: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, 'collected'))) }}"
    secrets: ["{{ vllm_api_key }}"]
    dir: /var/tmp/doctor
    cluster_name: spark1
  run_once: true
  register: doctor
"""

RETURN = r"""
path:
  description: The bundle written.
  returned: success
  type: str
  sample: /root/.cache/multinode-vllm/doctor/doctor-spark1-20260105T101500Z.tar.gz
lines:
  description: The findings as C(host - symptom -> cause -> fix) lines, most likely first (one line saying so when none).
  returned: success
  type: list
  elements: str
findings:
  description: The findings as data (rule, host, symptom, cause, fix, message, weight), redacted.
  returned: success
  type: list
  elements: dict
errors:
  description: C(host - part - why) for every part a node could not read.
  returned: success
  type: list
  elements: str
"""
