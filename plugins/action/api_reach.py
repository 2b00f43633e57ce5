# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side only: one TCP connect from the controller to the API address, with a short timeout.

Readiness (vllm_ready) polls the API from the controller, straight (proxy variables ignored), for up to
serve_ready_timeout (600 s). This answers the same question in seconds, before anything slow starts: does a TCP
connect from the controller to address:port get any answer? "connected" (an old server still runs) and "refused"
(nothing listens yet: the head's own RST) both mean the packets arrive; only a timeout or a "no route" fails.
Nothing is sent on the connection and nothing runs on the head.
"""

from __future__ import annotations

import socket
from typing import Optional

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.multinode.vllm.plugins.module_utils._inventory import (
    REACHED,
    api_reach_error,
    connect_outcome,
)

display = Display()


def tcp_connect(address: str, port: int, timeout: float) -> tuple[str, str]:
    """(outcome, detail) of one TCP connect from here, as connect_outcome words it; closes at once."""
    error: Optional[BaseException] = None
    try:
        with socket.create_connection((address, port), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:  # ValueError: a port or address Python refuses outright
        error = exc
    return connect_outcome(error)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("address", "address_var", "port", "timeout", "ssh_port"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        head = (task_vars or {}).get("inventory_hostname", "head")
        address = str(args.get("address") or "").strip()
        address_var = str(args.get("address_var") or "vllm_api_host")
        try:
            port = int(args.get("port", 8000))
            timeout = float(args.get("timeout", 3))
            ssh_port = int(args["ssh_port"]) if args.get("ssh_port") not in (None, "") else None
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail("api_reach: port, timeout and ssh_port must be numbers (%s)" % exc)

        outcome, detail = tcp_connect(address, port, timeout) if address else ("error", "no address")
        ssh_outcome = None
        if address and outcome not in REACHED and ssh_port is not None and ssh_port != port:
            # Only to word the message: is it the address, or the port?
            ssh_outcome = tcp_connect(address, ssh_port, timeout)[0]
        message = api_reach_error(head, address, address_var, port, outcome, detail, timeout, ssh_port, ssh_outcome)
        result.update(changed=False, address=address, port=port, outcome=outcome, detail=detail,
                      reachable=message is None)
        if message is not None:
            if self._task.check_mode:
                # This run's firewall was not applied in check mode: it might open the port. Say it, do not fail.
                display.warning(message)
                result["msg"] = "check mode: " + message
            else:
                result.update(failed=True, msg=message)
        else:
            result["msg"] = "the controller reaches %s:%d (%s)" % (address, port, outcome)
        return result
