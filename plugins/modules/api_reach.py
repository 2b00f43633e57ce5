#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: api_reach
short_description: From the controller, check in seconds that the vLLM API address answers a TCP connect
version_added: 0.1.0
description:
  - Runs on the controller only (an action plugin; nothing runs on the task's host). Opens one TCP connection to
    O(address):O(port) with a timeout of O(timeout) seconds and closes it at once, sending nothing.
  - Connected (a server already listens) and refused (nothing listens yet; the host's own reset) both mean that the
    controller's packets reach the host, so readiness will be able to poll the API once vLLM listens. A timeout or
    "no route" fails, naming the host, the address, the port and the fix, instead of readiness waiting
    C(serve_ready_timeout) for nothing.
  - On failure, O(ssh_port) on the same address is tried too, only to say whether the address or just the port is
    blocked.
  - In check mode a failure is a warning (this run's firewall, not applied in check mode, might open the port).
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  address:
    description: The API address (an IP address or a name the controller resolves). Empty fails, saying so.
    type: str
    required: true
  address_var:
    description: How the message names where O(address) came from.
    type: str
    default: vllm_api_host
  port:
    description: The API port.
    type: int
    default: 8000
  timeout:
    description: Seconds to wait for each TCP connect.
    type: float
    default: 3
  ssh_port:
    description: A second port tried on the same address when O(port) gets no answer (for the message only).
    type: int
notes:
  - The connect goes straight from the controller (proxy variables ignored), as readiness's HTTP requests do.
"""

EXAMPLES = r"""
- name: The controller reaches the API address
  multinode.vllm.api_reach:
    address: 198.19.1.10
    port: 8000
    timeout: 3
    ssh_port: 22
"""

RETURN = r"""
reachable:
  description: The connect got an answer (connected or refused).
  returned: always
  type: bool
outcome:
  description: One of connected, refused, timeout, unreachable, unresolved, error.
  returned: always
  type: str
detail:
  description: The outcome in words (the error the controller's kernel gave).
  returned: always
  type: str
address:
  description: The address tried.
  returned: always
  type: str
port:
  description: The port tried.
  returned: always
  type: int
"""
