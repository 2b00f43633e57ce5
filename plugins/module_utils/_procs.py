# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Find this node's Ray processes in /proc.

"This node" is the network namespace of the caller: on a real host that is
every process; in the lab (nodes share one PID namespace) it keeps spark1
from seeing, or stopping, spark2's raylet. ``ray stop`` matches processes by
name across the whole PID namespace, which is why the collection stops Ray
through these functions instead.

Reads /proc (``proc_root`` is a parameter for tests); no Ansible imports.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._runtime import HASH_ENV

# Names Ray gives its native processes and worker processes.
_RAY_NAMES = ("raylet", "gcs_server")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    netns: Optional[str]


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def read_process(pid: int, proc_root: str = "/proc") -> Optional[Proc]:
    base = os.path.join(proc_root, str(pid))
    stat = _read(os.path.join(base, "stat"))
    if stat is None:
        return None
    text = stat.decode("utf-8", "replace")
    # "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
    close = text.rfind(")")
    name = text[text.find("(") + 1:close]
    fields = text[close + 2:].split()
    try:
        ppid = int(fields[1])
    except (IndexError, ValueError):
        return None
    raw = _read(os.path.join(base, "cmdline")) or b""
    cmdline = tuple(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)
    try:
        netns: Optional[str] = os.readlink(os.path.join(base, "ns", "net"))
    except OSError:
        netns = None
    return Proc(pid=pid, ppid=ppid, name=name, cmdline=cmdline, netns=netns)


def read_processes(proc_root: str = "/proc") -> list[Proc]:
    procs = []
    for entry in os.listdir(proc_root):
        if entry.isdigit():
            proc = read_process(int(entry), proc_root)
            if proc is not None:
                procs.append(proc)
    return procs


def own_netns(proc_root: str = "/proc") -> Optional[str]:
    try:
        return os.readlink(os.path.join(proc_root, "self", "ns", "net"))
    except OSError:
        return None


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    raw = _read(os.path.join(proc_root, str(pid), "environ")) or b""
    env = {}
    for part in raw.split(b"\0"):
        if b"=" in part:
            key, _sep, value = part.partition(b"=")
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def carries_hash(pid: int, proc_root: str = "/proc") -> bool:
    """The process was started by this collection (its environment holds the config hash every runtime sets)."""
    raw = _read(os.path.join(proc_root, str(pid), "environ")) or b""
    return any(part.startswith(HASH_ENV.encode() + b"=") for part in raw.split(b"\0"))


def is_ray_process(proc: Proc) -> bool:
    """A process of a Ray node: raylet, GCS, Ray's Python helpers and workers, or `ray start` itself."""
    if proc.name in _RAY_NAMES or proc.name.startswith("ray::"):
        return True
    head = proc.cmdline[:3]
    if any("/site-packages/ray/" in part for part in head):
        return True
    for i in (1, 2):
        if proc.cmdline[i:i + 1] == ("-m",) and proc.cmdline[i + 1:i + 2] and proc.cmdline[i + 1].startswith("ray."):
            return True
    for i, part in enumerate(proc.cmdline[:2]):
        if (part == "ray" or part.endswith("/bin/ray")) and "start" in proc.cmdline[i + 1:i + 2]:
            return True
    return False


def flag_value(cmdline: Sequence[str], *names: str) -> Optional[str]:
    """Value of ``--name=value`` or ``--name value`` in a command line."""
    for i, part in enumerate(cmdline):
        for name in names:
            if part == name and i + 1 < len(cmdline):
                return cmdline[i + 1]
            if part.startswith(name + "="):
                return part[len(name) + 1:]
    return None


def ancestors(pid: int, by_pid: Mapping[int, Proc]) -> list[int]:
    chain = []
    seen = set()
    current = by_pid.get(pid)
    while current is not None and current.ppid not in seen and current.ppid > 0:
        seen.add(current.ppid)
        chain.append(current.ppid)
        current = by_pid.get(current.ppid)
    return chain


def supervisord_pid(pidfile: str, procs: Mapping[int, Proc], netns: Optional[str]) -> Optional[int]:
    """The pid in ``pidfile`` if it is a live supervisord in this network namespace."""
    raw = _read(pidfile)
    if not raw:
        return None
    try:
        pid = int(raw.strip())
    except ValueError:
        return None
    proc = procs.get(pid)
    if proc is None or proc.netns != netns:
        return None
    if not any("supervisord" in part for part in proc.cmdline[:3]):
        return None
    return pid


def auth_state(env: dict[str, str], proc_root: str, pid: int) -> dict[str, Any]:
    """The raylet's token-auth mode and the sha256 of its token file now (never the token): verify compares nodes."""
    out: dict[str, Any] = {}
    if env.get("RAY_AUTH_MODE"):
        out["RAY_AUTH_MODE"] = env["RAY_AUTH_MODE"]
    path = env.get("RAY_AUTH_TOKEN_PATH")
    if path:
        out["RAY_AUTH_TOKEN_PATH"] = path
        # Read through the raylet's own root, so a container's view is the one compared.
        out["auth_token_sha256"] = token_digest(os.path.join(proc_root, str(pid), "root") + path)
    return out


def _read_token(path: str) -> bytes | None:
    """A token file's content without surrounding whitespace (what Ray reads); None when unreadable."""
    try:
        with open(path, "rb") as handle:
            return handle.read().strip()
    except OSError:
        return None


def token_digest(path: str) -> str | None:
    """sha256 of a token file's content (never the content); None when unreadable."""
    token = _read_token(path)
    return hashlib.sha256(token).hexdigest() if token is not None else None


def token_file_state(path: str) -> dict[str, Any]:
    """A token file as deploy decides whether to (re)write it: digest and validity (never the content), mode, owner."""
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path, "exists": False, "sha256": None, "valid": False, "mode": None, "uid": None}
    token = _read_token(path)
    return {"path": path, "exists": True,
            "sha256": hashlib.sha256(token).hexdigest() if token is not None else None,
            # What Ray and the deploy accept (>= 32 characters, no whitespace): only the verdict leaves the node.
            "valid": token is not None and len(token) >= 32 and not any(c.isspace() for c in token.decode("latin-1")),
            "mode": "%04o" % (st.st_mode & 0o7777), "uid": st.st_uid}


def is_serve(cmdline: Sequence[str]) -> bool:
    """``.../vllm serve ...`` or ``python .../vllm serve ...`` (not the launcher that execs it)."""
    for i, part in enumerate(cmdline[:3]):
        if (part == "vllm" or part.endswith("/vllm")) and tuple(cmdline[i + 1:i + 2]) == ("serve",):
            return True
    return False


WATCHDOG_SCRIPT = "multinode-watchdog"


def is_watchdog(cmdline: Sequence[str]) -> bool:
    """``<python> .../multinode-watchdog --config ...`` in its loop (not a ``--once`` or ``--check-ray`` run)."""
    return any(part.endswith("/" + WATCHDOG_SCRIPT) for part in cmdline[:4]) and "--config" in cmdline and \
        "--check-ray" not in cmdline and "--once" not in cmdline


def serve_tree(procs: Mapping[int, Any], me: int) -> tuple[Optional[int], list[int]]:
    """(main vllm serve pid or None, every pid of the serve process trees) among procs (one network namespace)."""
    roots = sorted(p.pid for p in procs.values() if is_serve(p.cmdline) and p.pid != me)
    # The main process: a serve process whose ancestors hold no other serve process.
    main = [pid for pid in roots if not set(ancestors(pid, procs)) & set(roots)]
    tree = {pid for pid in procs if pid in roots or set(ancestors(pid, procs)) & set(roots)}
    return (main[0] if main else None), sorted(tree)


def serve_processes(proc_root: str = "/proc") -> tuple[Optional[int], list[int]]:
    """serve_tree of this network namespace."""
    netns = own_netns(proc_root)
    return serve_tree({p.pid: p for p in read_processes(proc_root) if p.netns == netns}, os.getpid())


_CONTAINER_ID = re.compile(r"^(?:docker-)?([0-9a-f]{64})(?:\.scope)?$")


def owner_from_cgroup(text: str) -> Optional[dict[str, str]]:
    """What supervises a process, from its /proc/PID/cgroup: the innermost systemd unit or Docker container.

    ``{"unit": "ray-head.service"}``, ``{"container": "<64 hex>"}``, or None (a login session, a scope of its own, or
    no init that groups processes). The innermost owner is the last one in the path: a unit of a systemd that runs in
    a container (``/docker/<id>/system.slice/ray-head.service``, the lab's systemd nodes) is the unit.
    """
    best: Optional[dict[str, str]] = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        # cgroup v2 ("0::/path") or v1's systemd hierarchy ("N:name=systemd:/path"): the ones systemd lays out.
        if len(parts) != 3 or parts[1] not in ("", "name=systemd"):
            continue
        found = None
        for segment in parts[2].split("/"):
            container = _CONTAINER_ID.match(segment)
            if container:
                found = {"container": container.group(1)}
            elif segment.endswith(".service"):
                found = {"unit": segment}
        if found is not None:
            best = found
            if parts[1] == "name=systemd":
                break
    return best


def process_owner(pid: int, proc_root: str = "/proc") -> Optional[dict[str, str]]:
    """owner_from_cgroup of a process; None when its cgroup file cannot be read."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup")) as handle:
            return owner_from_cgroup(handle.read())
    except OSError:
        return None


def ray_supervisor(pid: int, procs: Mapping[int, Proc], proc_root: str = "/proc") -> Optional[dict[str, str]]:
    """The unit or container that exists to run this Ray process: the owner of its cgroup, if the topmost process
    of that cgroup above it is Ray itself (``ray start``). A Ray started from a shell inside some other service (a CI
    runner's unit, a container whose entrypoint is a script) is not that service's to stop: None."""
    owner = process_owner(pid, proc_root)
    if owner is None:
        return None
    top = pid
    for parent in ancestors(pid, procs):
        if parent not in procs or process_owner(parent, proc_root) != owner:
            break
        top = parent
    return owner if is_ray_process(procs[top]) else None


def node_state(pidfile: str, proc_root: str = "/proc") -> dict[str, Any]:
    """What Ray runs in this network namespace, and whether our supervisord started it."""
    netns = own_netns(proc_root)
    me = os.getpid()
    procs = {p.pid: p for p in read_processes(proc_root) if p.netns == netns}
    sup = supervisord_pid(pidfile, procs, netns)
    mine = set(ancestors(me, procs)) | {me}
    ray = sorted((p for p in procs.values() if p.pid not in mine and is_ray_process(p)), key=lambda p: p.pid)
    raylets = [p for p in ray if p.name == "raylet"]
    state: dict[str, Any] = {
        "netns": netns,
        "running": bool(raylets),
        "raylet_pid": None,
        "node_ip_address": None,
        "start_node_ip_address": None,
        "start_cmdline": None,
        "gcs_server": any(p.name == "gcs_server" for p in ray),
        "env": {},
        "config_hash": None,
        "supervisord_pid": sup,
        "managed": False,
        "processes": [{"pid": p.pid, "name": p.name} for p in ray],
        "foreign_pids": [],
        "foreign_owner": None,
    }
    managed_pids = set()
    if sup is not None:
        managed_pids = {p.pid for p in ray if sup in ancestors(p.pid, procs)}
    # Started by this collection under any runtime: every program it starts carries its config hash in the
    # environment (supervisor environment=, systemd Environment=, docker env), inherited by its children, and
    # still there after a reparent (supervisord stopped first). Foreign: neither under our supervisord nor
    # carrying the hash (a hand-started Ray); only ray_stop_foreign lets the collection stop those. Strays: ours,
    # but not under this node's supervisord (the units of systemd/docker, or orphans of the process runtime).
    hashed = {p.pid for p in ray if carries_hash(p.pid, proc_root)}
    state["foreign_pids"] = [p.pid for p in ray if p.pid not in managed_pids and p.pid not in hashed]
    state["stray_pids"] = [p.pid for p in ray if p.pid not in managed_pids and p.pid in hashed]
    state["ours_pids"] = sorted(managed_pids | hashed)
    # vllm serve here (a native rank left on a worker, or the head's server), and whether our supervisord runs it.
    serve_pid, serve_pids = serve_tree(procs, me)
    state["serve_pid"] = serve_pid
    state["serve_pids"] = serve_pids
    state["serve_managed"] = serve_pid is not None and sup is not None and sup in ancestors(serve_pid, procs)
    state["serve_ours_pids"] = [pid for pid in serve_pids
                                if (sup is not None and sup in ancestors(pid, procs)) or carries_hash(pid, proc_root)]
    # The head's watchdog (serve_watchdog_enabled), and whether our supervisord runs it.
    watchdogs = sorted(p.pid for p in procs.values() if is_watchdog(p.cmdline) and p.pid != me)
    state["watchdog_pid"] = watchdogs[0] if watchdogs else None
    state["watchdog_managed"] = bool(watchdogs) and sup is not None and any(
        sup in ancestors(pid, procs) for pid in watchdogs)
    if raylets:
        raylet = raylets[0]
        env = read_environ(raylet.pid, proc_root)
        state["raylet_pid"] = raylet.pid
        state["raylet_count"] = len(raylets)
        state["node_ip_address"] = flag_value(raylet.cmdline, "--node_ip_address")
        state["env"] = {k: env[k] for k in sorted(env) if k == "VLLM_HOST_IP" or k.endswith("_SOCKET_IFNAME")}
        state["config_hash"] = env.get(HASH_ENV)
        state["env"].update(auth_state(env, proc_root, raylet.pid))
        state["managed"] = raylet.pid in managed_pids
        # A foreign raylet's unit or container: stopping its processes alone would let that restart them.
        state["foreign_owner"] = (ray_supervisor(raylet.pid, procs, proc_root) if raylet.pid in state["foreign_pids"]
                                  else None)
        for pid in ancestors(raylet.pid, procs):
            parent = procs.get(pid)
            if parent is not None and is_ray_process(parent) and "start" in parent.cmdline:
                state["start_cmdline"] = list(parent.cmdline)
                state["start_node_ip_address"] = flag_value(parent.cmdline, "--node-ip-address")
                break
    return state
