#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: nft_apply
short_description: Replace one nftables table atomically, with a rollback unless the controller confirms
version_added: 0.1.0
description:
  - O(state=present) replaces the table O(table) (family C(inet)) with O(ruleset) in one C(nft -f) transaction. The
    ruleset must declare, delete and declare the table again in full (as the P(multinode.vllm.firewall#role) role
    renders it), so other software's tables are never touched.
  - Compares with C(nft list table) (traffic counts ignored) for idempotence. The wanted table is loaded in a
    throwaway network namespace (C(unshare --net)) to get nft's own listing of it, so the comparison and the diff
    are exact; where no namespace can be made, the last applied ruleset (kept in O(state_dir)) is compared instead.
  - Before applying, the ruleset is checked with C(nft -c -f), the current table is saved and a detached process is
    armed that puts the saved table back after O(rollback_timeout) seconds. A later call with O(state=confirmed),
    made over a fresh connection, disarms it. So a ruleset that locks the controller out is rolled back by itself.
  - Just before the controller closes its connection to open a fresh one, O(state=confirming) records on the host
    that the confirmation was asked for. A rollback records whether it was. If it was, the fresh connection did not
    get in (a lockout), and the same ruleset is refused on the next run (the marker file named in the error says how
    to retry). If it was not, the play stopped before confirming (another host failed, the controller was
    interrupted), the ruleset is not to blame, and the next run applies it again.
  - O(state=confirmed) and O(state=absent) clear the rollback marker.
  - O(state=absent) deletes the table (and disarms a pending rollback). In check mode nothing changes.
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
  state:
    description:
      - V(present) applies O(ruleset) and arms the rollback when the table changed.
      - V(confirming) records that the controller is about to confirm the change of O(token) over a fresh
        connection (call it over the connection that applied it, right before closing that connection).
      - V(confirmed) disarms the rollback (call it from a fresh connection to prove the controller still gets in);
        fails when the change of O(token) was already rolled back.
      - V(absent) deletes the table.
    type: str
    choices: [present, confirming, confirmed, absent]
    default: present
  ruleset:
    description: The C(nft -f) file text. Required with O(state=present).
    type: str
  table:
    description: The table name (family C(inet)).
    type: str
    default: multinode_vllm
  rollback_timeout:
    description: Seconds after applying before the previous table is put back unless confirmed.
    type: float
    default: 60
  token:
    description: With O(state=confirming) or O(state=confirmed), the RV(token) the apply returned.
    type: str
  state_dir:
    description: Where the rollback file, the pending guard and the rollback marker are kept (tmpfs is right).
    type: path
    default: /run/multinode-vllm/firewall
"""

EXAMPLES = r"""
- name: Apply the node firewall (rolled back in 60 s unless confirmed)
  multinode.vllm.nft_apply:
    ruleset: "{{ lookup('ansible.builtin.template', 'firewall.nft.j2') }}"
    rollback_timeout: 60
  register: applied

- name: Open a fresh connection
  ansible.builtin.meta: reset_connection

- name: Confirm from the fresh connection
  multinode.vllm.nft_apply:
    state: confirmed
    token: "{{ applied.token | default(omit) }}"
"""

RETURN = r"""
table:
  description: The table, C(inet NAME).
  returned: always
  type: str
armed:
  description: Whether a rollback is now pending (present) or was pending (confirmed).
  returned: always
  type: bool
token:
  description: Identifies the pending rollback; pass it to O(state=confirmed).
  returned: when armed
  type: str
rollback_at:
  description: Unix time at which the previous table is put back unless confirmed.
  returned: when armed
  type: float
exact:
  description: Whether the comparison used nft's own listing of the wanted table (a throwaway network namespace).
  returned: with state=present
  type: bool
rolled_back:
  description:
    - The last rollback on this host (token, digest, time, nft's exit status, C(confirm_started) and C(reason), why it
      happened), or null.
  returned: always
  type: dict
"""

import fcntl
import json
import os
import secrets
import subprocess
import tempfile
import time
from contextlib import contextmanager

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._detach import run_detached
from ansible_collections.multinode.vllm.plugins.module_utils._firewall import (
    FAMILY,
    normalise_listing,
    replace_script,
    ruleset_digest,
)

# Exit status of the scratch-namespace script when nft itself refused the ruleset.
_NFT_REFUSED = 97
_SCRATCH = 'nft -f "$1" >/dev/null || exit %d; nft list tables; echo @@@; nft list table %s "$2"' % (_NFT_REFUSED, FAMILY)


class Paths:
    def __init__(self, state_dir, table):
        base = os.path.join(state_dir, table)
        self.lock = base + ".lock"
        self.armed = base + ".armed.json"
        self.rollback = base + ".rollback.nft"
        self.marker = base + ".rolled-back.json"
        self.applied = base + ".applied.json"


def _write(path, text):
    # Atomic: the watcher never reads half a file.
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@contextmanager
def _locked(paths):
    with open(paths.lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _armed_token(paths):
    armed = _read_json(paths.armed)
    return armed.get("token") if isinstance(armed, dict) else None


def _watch(nft, paths, token, deadline):  # pragma: no cover - runs in the detached process
    """Put the saved table back at ``deadline`` unless the guard ``token`` was disarmed or replaced."""
    while time.time() < deadline:
        if _armed_token(paths) != token:
            return
        time.sleep(0.2)
    with _locked(paths):
        if _armed_token(paths) != token:
            return
        armed = _read_json(paths.armed) or {}
        proc = subprocess.run([nft, "-f", paths.rollback], capture_output=True, text=True, check=False)
        started = bool(armed.get("confirm_started_at"))
        marker = dict(token=token, digest=armed.get("digest"), applied_at=armed.get("applied_at"),
                      rolled_back_at=time.time(), timeout=armed.get("timeout"), rc=proc.returncode,
                      stderr=proc.stderr.strip(), confirm_started=started,
                      reason=("the controller asked to confirm over a fresh connection and none got in within the "
                              "window (a lockout?)" if started else
                              "the play never asked for a confirmation (it stopped before: another host failed, or "
                              "the controller was interrupted)"))
        _write(paths.marker, json.dumps(marker))
        _remove(paths.armed)
        _remove(paths.applied)


def _nft(module, nft, *args):
    return module.run_command([nft] + list(args))


def _current(module, nft, table):
    """nft's listing of the live table, or None when there is none."""
    rc, out, err = _nft(module, nft, "list", "table", FAMILY, table)
    if rc == 0:
        return out
    if "No such file or directory" in err:
        return None
    module.fail_json(msg="cannot read table %s %s: `nft list table` failed (rc %d): %s; fix nftables on this host"
                     % (FAMILY, table, rc, err.strip()))


def _canonical(module, paths, table, ruleset):
    """nft's own listing of ``ruleset`` loaded in a throwaway network namespace, or None if none can be made."""
    unshare = module.get_bin_path("unshare")
    if unshare is None:
        return None
    candidate = _staged(module, ruleset)
    try:
        rc, out, err = module.run_command([unshare, "--net", "sh", "-c", _SCRATCH, "sh", candidate, table])
    finally:
        _remove(candidate)
    if rc == _NFT_REFUSED:
        module.fail_json(msg="nft refused the ruleset for table %s %s: %s; fix the input (nothing was changed)"
                         % (FAMILY, table, err.strip()))
    if rc != 0:
        return None  # no namespace here (no CAP_SYS_ADMIN): fall back to the last applied ruleset
    tables, dummy, listing = out.partition("@@@\n")
    made = sorted(line.strip() for line in tables.splitlines() if line.strip())
    if made != ["table %s %s" % (FAMILY, table)]:
        module.fail_json(msg="the ruleset creates %s, expected only table %s %s (so no other software's table is "
                         "touched); fix the input (nothing was changed)" % (made, FAMILY, table))
    return normalise_listing(listing)


def _present(module, nft, paths, table, result):
    ruleset = module.params["ruleset"]
    if ruleset is None:
        module.fail_json(msg="state=present needs ruleset (the nft -f text); nothing was changed", **result)
    header = "delete table %s %s" % (FAMILY, table)
    if header not in [line.strip() for line in ruleset.splitlines()]:
        module.fail_json(msg="the ruleset has no line %r, expected the table to be declared, deleted and declared "
                         "again in full so nft replaces it atomically; render it with the firewall role" % header,
                         **result)
    digest = ruleset_digest(ruleset)
    listing = _current(module, nft, table)
    before = normalise_listing(listing)
    after = _canonical(module, paths, table, ruleset)
    result["exact"] = after is not None
    if after is not None:
        changed = after != before
    else:
        applied = _read_json(paths.applied) or {}
        changed = not (applied.get("digest") == digest and applied.get("listing") == before and before)
    result["changed"] = changed
    if module._diff:
        result["diff"] = dict(before=before, after=after if after is not None else ruleset,
                              before_header="nft list table %s %s" % (FAMILY, table),
                              after_header="ruleset" if after is None else "ruleset as nft lists it")
    if not changed or module.check_mode:
        module.exit_json(**result)

    marker = _read_json(paths.marker)
    # Only a lockout blames the ruleset: a rollback because the play stopped before confirming does not.
    if isinstance(marker, dict) and marker.get("digest") == digest and marker.get("confirm_started", True):
        module.fail_json(
            msg="this exact ruleset was applied at %s and rolled back at %s because no fresh connection confirmed it "
                "within %s s (the controller lost the host?); the previous table is active. Check that "
                "firewall_mgmt_allow_tcp "
                "holds the SSH port and that the controller reaches the host on the management interface, then "
                "change the input, or delete %s to try the same ruleset again (nothing was changed)"
                % (time.ctime(marker.get("applied_at") or 0), time.ctime(marker.get("rolled_back_at") or 0),
                   marker.get("timeout"), paths.marker), **result)

    staged = _staged(module, ruleset)
    rc, dummy, err = _nft(module, nft, "-c", "-f", staged)
    if rc != 0:
        module.fail_json(msg="nft -c refused the ruleset for table %s %s: %s; fix the input (nothing was changed)"
                         % (FAMILY, table, err.strip()), **result)

    timeout = module.params["rollback_timeout"]
    _ensure_dir(module)
    with _locked(paths):
        pending = _read_json(paths.armed)
        # With an unconfirmed earlier change still pending, keep its rollback file: the last confirmed table.
        if not isinstance(pending, dict):
            _write(paths.rollback, replace_script(table, listing))
            rc, dummy, err = _nft(module, nft, "-c", "-f", paths.rollback)
            if rc != 0:
                module.fail_json(msg="the current table %s %s cannot be saved for the rollback (nft -c: %s); "
                                 "refusing to apply without a way back (nothing was changed)"
                                 % (FAMILY, table, err.strip()), **result)
        token = secrets.token_hex(8)
        now = time.time()
        deadline = now + timeout
        _write(paths.armed, json.dumps(dict(token=token, digest=digest, applied_at=now, deadline=deadline,
                                            timeout=timeout)))
        # Armed before the apply: if this process dies right after it, the table still comes back.
        watcher = run_detached(lambda: _watch(nft, paths, token, deadline), [])
        rc, dummy, err = _nft(module, nft, "-f", staged)
        if rc != 0:
            if pending:
                _write(paths.armed, json.dumps(pending))
            else:
                _remove(paths.armed)
            module.fail_json(msg="nft -f failed for table %s %s: %s; the table was not changed (one transaction)"
                             % (FAMILY, table, err.strip()), **result)
        _write(paths.applied, json.dumps(dict(digest=digest, listing=normalise_listing(_current(module, nft, table)))))
    result.update(armed=True, token=token, rollback_at=deadline, watcher_pid=watcher)
    module.exit_json(**result)


def _staged(module, ruleset):
    # In Ansible's remote temp dir (removed after the task): check mode writes nothing of ours.
    handle, path = tempfile.mkstemp(prefix="nft_apply.", suffix=".nft", dir=module.tmpdir)
    with os.fdopen(handle, "w") as out:
        out.write(ruleset)
    return path


def _ensure_dir(module):
    os.makedirs(module.params["state_dir"], mode=0o700, exist_ok=True)


def _confirming(module, paths, result):
    token = module.params["token"]
    if not token or not os.path.isdir(module.params["state_dir"]):
        module.exit_json(**result)
    with _locked(paths):
        armed = _read_json(paths.armed)
        if isinstance(armed, dict) and armed.get("token") == token and not module.check_mode:
            armed["confirm_started_at"] = time.time()
            _write(paths.armed, json.dumps(armed))
            result["armed"] = True
    module.exit_json(**result)


def _confirmed(module, paths, result):
    token = module.params["token"]
    if not os.path.isdir(module.params["state_dir"]):
        module.exit_json(**result)  # nothing was ever armed here
    with _locked(paths):
        armed = _read_json(paths.armed)
        marker = _read_json(paths.marker)
        if isinstance(armed, dict):
            result["armed"] = True
            if not module.check_mode:
                # This call came over a fresh connection: the controller gets in with the current table.
                _remove(paths.armed)
                _remove(paths.rollback)
                _remove(paths.marker)  # an older rollback no longer describes this host
            # Disarming is not a change of configuration (the apply reported it).
            module.exit_json(**result)
    if token and isinstance(marker, dict) and marker.get("token") == token:
        module.fail_json(
            msg="the firewall change %s was rolled back at %s: no confirmation came within %s s of applying it (the "
                "controller lost the host?); the previous table is active. Check firewall_mgmt_allow_tcp and the "
                "management interface, then run again" % (token, time.ctime(marker.get("rolled_back_at") or 0),
                                                          marker.get("timeout")), **result)
    module.exit_json(**result)


def _absent(module, nft, paths, table, result):
    listing = _current(module, nft, table)
    result["changed"] = listing is not None
    if module._diff:
        result["diff"] = dict(before=normalise_listing(listing), after="")
    if module.check_mode:
        module.exit_json(**result)
    _ensure_dir(module)
    with _locked(paths):
        _remove(paths.armed)
        _remove(paths.rollback)
        _remove(paths.applied)
        _remove(paths.marker)
        if listing is not None:
            rc, dummy, err = _nft(module, nft, "delete", "table", FAMILY, table)
            if rc != 0:
                module.fail_json(msg="nft delete table %s %s failed: %s" % (FAMILY, table, err.strip()), **result)
    module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "confirming", "confirmed", "absent"], default="present"),
            ruleset=dict(type="str"),
            table=dict(type="str", default="multinode_vllm"),
            rollback_timeout=dict(type="float", default=60),
            token=dict(type="str", no_log=False),
            state_dir=dict(type="path", default="/run/multinode-vllm/firewall"),
        ),
        supports_check_mode=True,
    )
    table = module.params["table"]
    if module.params["rollback_timeout"] < 1:
        module.fail_json(msg="rollback_timeout %s, expected at least 1 second; fix rollback_timeout"
                         % module.params["rollback_timeout"])
    nft = module.get_bin_path("nft", required=True)
    paths = Paths(module.params["state_dir"], table)
    result = dict(changed=False, table="%s %s" % (FAMILY, table), armed=False, rolled_back=_read_json(paths.marker))
    state = module.params["state"]
    if state == "present":
        _present(module, nft, paths, table, result)
    elif state == "confirming":
        _confirming(module, paths, result)
    elif state == "confirmed":
        _confirmed(module, paths, result)
    else:
        _absent(module, nft, paths, table, result)


if __name__ == "__main__":
    main()
