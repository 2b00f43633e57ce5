# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fabric reachability probe: short-lived listeners, per-peer checks, the all-pairs report.

The probe needs nothing on the host but Python and ``ip``: no ICMP tools, no
packages. Each host starts a listener (TCP and UDP on its fabric address and
the probe port) that lives for a bounded time, then every host probes every
peer. ``assemble_report`` (pure) turns the per-host results into the matrix
and the list of broken pairs the controller fails on.
"""

from __future__ import annotations

import errno
import hmac
import json
import os
import select
import socket
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._detach import ConnectionGate, LineReader, bind_replacing
from ansible_collections.multinode.vllm.plugins.module_utils._detach import listen_error, refuse, run_detached
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

# Linux socket options for "do not fragment" on UDP (linux/in.h).
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
IPV4_UDP_OVERHEAD = 28  # 20-byte IPv4 header + 8-byte UDP header

MAGIC = b"MNVLLM-PROBE"


class ProbeError(MultinodeError):
    """The probe could not run (bad parameters, port taken); the message says why."""


def _fmt_seconds(value: float) -> str:
    return "%g s" % value


# ---------------------------------------------------------------------------
# Listener
# ---------------------------------------------------------------------------


def control_address(port: int) -> str:
    """Abstract unix socket of the listener on ``port``.

    Abstract sockets belong to the network namespace, so each node has its own,
    and no firewall rule on the fabric can block stopping a listener.
    """
    return "\0multinode-vllm-probe-%d" % port


def stop_listener(port: int) -> bool:
    """Ask this node's probe listener on ``port`` to exit. True if one was there."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(1.0)
            conn.connect(control_address(port))
            conn.sendall(MAGIC + b" QUIT\n")
            conn.settimeout(3.0)
            conn.recv(16)  # the listener closes this connection only after its own sockets
        return True
    except OSError:
        return False


def bind_listener(ip: str, port: int, wait: float = 3.0) -> tuple[socket.socket, socket.socket]:
    """Bind the TCP and UDP listener sockets on ip:port, replacing a stale probe listener.

    A stale listener is asked to quit through its control socket: over TCP it would need its own run's token.
    """
    def bind() -> tuple[socket.socket, socket.socket]:
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tcp.bind((ip, port))
            udp.bind((ip, port))
            tcp.listen(64)
        except OSError:
            tcp.close()
            udp.close()
            raise
        return tcp, udp

    try:
        return bind_replacing(bind, lambda: stop_listener(port), wait, tick=0.2)
    except OSError as exc:
        raise ProbeError(listen_error(exc, ip, port, "fabric_probe_port"))


# What a connection may send (tests/unit/.../test__probe.py, "Before the token"): a line is MAGIC, a verb, a host
# name and the token; each must arrive within LINE_SECONDS (a prober sends its next line at once).
LINE_LIMIT = 1024
LINE_SECONDS = 10.0
# Open connections per peer address: a prober holds one (PING), then one more (DONE).
PER_PEER_CONNECTIONS = 4
CONTROL_CONNECTIONS = 8


def serve(
    tcp: socket.socket,
    udp: socket.socket,
    host: str,
    expected_peers: Mapping[str, str],
    lifetime: float,
    control: Optional[socket.socket] = None,
    token: str = "",
) -> None:
    """Answer probes until every expected peer said DONE, a QUIT arrives, or lifetime ends.

    ``expected_peers`` maps each peer's name to its fabric address. Only those addresses are answered (TCP and
    UDP), a few connections each; DONE and QUIT over TCP count only with ``token`` (this run's), QUIT on the
    node-local control socket without. An empty token honours neither.
    """
    deadline = time.monotonic() + lifetime
    names_at: dict[str, set[str]] = {}
    for name, address in expected_peers.items():
        names_at.setdefault(str(address), set()).add(str(name))
    gate = ConnectionGate(names_at, PER_PEER_CONNECTIONS)
    control_gate = ConnectionGate(["control"], CONTROL_CONNECTIONS)
    secret = token.encode()
    done: set[str] = set()
    stop = threading.Event()
    lock = threading.Lock()
    # QUIT connections stay open until the listening sockets are closed, so that whoever asked to stop returns
    # only once nothing listens any more (no select tick later). Once closed, a late QUIT is answered at once.
    quitters: list[socket.socket] = []
    closed = False

    def authentic(parts: list[bytes], index: int) -> bool:
        return bool(secret) and len(parts) > index and hmac.compare_digest(parts[index], secret)

    def handle(conn: socket.socket, origin: str) -> None:
        """One admitted connection; ``origin`` is the peer address, or "control" for the control socket."""
        reader = LineReader(conn)
        try:
            while True:
                parts = reader.readline(LINE_LIMIT, max(0.1, min(LINE_SECONDS, deadline - time.monotonic()))).split()
                if len(parts) < 2 or parts[0] != MAGIC:
                    return
                verb = parts[1]
                if verb == b"PING" and origin != "control":
                    conn.sendall(MAGIC + b" PONG " + host.encode() + b"\n")
                elif verb == b"DONE" and len(parts) > 2 and origin != "control":
                    name = parts[2].decode(errors="replace")
                    if name in names_at[origin] and authentic(parts, 3):
                        with lock:
                            done.add(name)
                            if set(expected_peers) <= done:
                                stop.set()
                    return
                elif verb == b"QUIT" and (origin == "control" or authentic(parts, 2)):
                    with lock:
                        quitters.append(conn)
                    stop.set()
                    return
                else:
                    return
        except Exception:  # pylint: disable=broad-except  # one connection's failure never stops the listener
            return
        finally:
            (control_gate if origin == "control" else gate).release(origin)
            with lock:
                if closed or conn not in quitters:
                    conn.close()

    while not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        watched = [tcp, udp] + ([control] if control is not None else [])
        readable = select.select(watched, [], [], min(remaining, 0.5))[0]
        for sock in readable:
            if sock is udp:
                try:
                    data, peer = udp.recvfrom(65535)
                    if peer[0] in names_at:  # echo only to a peer: no reflector for anyone else
                        udp.sendto(data, peer)
                except OSError:
                    pass
                continue
            try:
                conn, addr = sock.accept()
            except OSError:
                continue
            origin = "control" if sock is control else addr[0]
            # Decided before reading a byte: a stranger, or a peer over its few connections, costs no thread.
            if (control_gate if origin == "control" else gate).admit(origin) is not None:
                refuse(conn)
                continue
            threading.Thread(target=handle, args=(conn, origin), daemon=True).start()
    tcp.close()
    udp.close()
    if control is not None:
        control.close()
    with lock:
        closed = True
        for conn in quitters:
            conn.close()


def bind_control(port: int, wait: float = 3.0) -> socket.socket:
    """Bind the listener's control socket, asking a running listener on ``port`` to quit."""
    def bind() -> socket.socket:
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            control.bind(control_address(port))
            control.listen(8)
        except OSError:
            control.close()
            raise
        return control

    try:
        return bind_replacing(bind, lambda: stop_listener(port), wait)
    except OSError as exc:
        raise ProbeError("cannot create the probe's control socket for port %d: %s" % (port, exc))


def spawn_listener(
    ip: str, port: int, host: str, expected_peers: Mapping[str, str], lifetime: float, token: str
) -> int:
    """Bind now (errors surface here), then serve from a detached grandchild. Returns its pid.

    ``expected_peers`` maps each peer's name to its fabric address; ``token`` is this run's (DONE carries it).
    """
    if not token:
        raise ProbeError("the probe listener needs this run's token (the fabric role makes one per run)")
    control = bind_control(port)
    try:
        tcp, udp = bind_listener(ip, port)
    except ProbeError:
        control.close()
        raise
    return run_detached(lambda: serve(tcp, udp, host, expected_peers, lifetime, control, token), (tcp, udp, control))


# ---------------------------------------------------------------------------
# Probing one peer
# ---------------------------------------------------------------------------


def route_get(ip: str) -> dict[str, Any]:
    out = subprocess.run(["ip", "-j", "route", "get", ip], check=True, capture_output=True, text=True).stdout
    data = json.loads(out or "[]")
    return data[0] if data else {}


def evaluate_route(route: Mapping[str, Any], interface: str, local_ip: str) -> Optional[str]:
    """None if the route to a peer leaves through the fabric interface from the fabric address."""
    dev = route.get("dev")
    src = route.get("prefsrc")
    if dev != interface:
        via = " via %s" % route["gateway"] if route.get("gateway") else ""
        return "route leaves through %s%s, not the fabric interface %s" % (dev or "nothing", via, interface)
    if src != local_ip:
        return "route source is %s, not the fabric address %s" % (src, local_ip)
    return None


def _connect(local_ip: str, peer_ip: str, port: int, timeout: float, listener_wait: float) -> socket.socket:
    """Connect from the fabric address. A refusal is retried for listener_wait seconds: with phase listen_probe the
    peers start their listeners in the same task, a moment apart. Only a refusal: a timeout or an unreachable
    network is an answer at once."""
    deadline = time.monotonic() + listener_wait
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.bind((local_ip, 0))
            sock.connect((peer_ip, port))
            return sock
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
        except OSError:
            sock.close()
            raise


def _tcp_check(local_ip: str, peer_ip: str, port: int, timeout: float, listener_wait: float = 0.0) -> dict[str, Any]:
    result: dict[str, Any] = {"ok": False, "error": None, "connect_ms": None, "rtt_ms": None, "answered_by": None}
    sock = None
    try:
        start = time.monotonic()
        sock = _connect(local_ip, peer_ip, port, timeout, listener_wait)
        result["connect_ms"] = round((time.monotonic() - start) * 1000, 3)
        reader = sock.makefile("rb")
        rtts = []
        for _attempt in range(5):
            start = time.monotonic()
            sock.sendall(MAGIC + b" PING\n")
            line = reader.readline().split()
            rtts.append((time.monotonic() - start) * 1000)
            if len(line) < 3 or line[0] != MAGIC or line[1] != b"PONG":
                result["error"] = "port %d answered, but not with the probe protocol" % port
                return result
            result["answered_by"] = line[2].decode(errors="replace")
        result["rtt_ms"] = round(statistics.median(rtts), 3)
        result["ok"] = True
    except socket.timeout:
        # No SYN-ACK: something drops the port (a firewall on either node, such as one a deploy with fewer nodes
        # left, which allows only its own members) or the path. Connected but no PONG: the listener stalled.
        result["error"] = "timed out after %s %s" % (_fmt_seconds(timeout), (
            "waiting for the probe listener's answer on port %d (the peer is overloaded or stalled)" % port
            if sock is not None else
            "connecting to port %d (no answer: a firewall on either node drops it, or the path does)" % port))
    except ConnectionRefusedError:
        result["error"] = "connection refused on port %d (no probe listener there, or a firewall rejects it)" % port
        if listener_wait:
            result["error"] += " for %s" % _fmt_seconds(listener_wait)
    except OSError as exc:
        result["error"] = exc.strerror or str(exc)
    finally:
        if sock is not None:
            sock.close()
    return result


def _say_done(local_ip: str, peer_ip: str, port: int, timeout: float, me: str, token: str) -> None:
    """Tell the peer's listener this host has finished probing it (it exits once every peer has)."""
    try:
        with socket.create_connection((peer_ip, port), timeout=timeout, source_address=(local_ip, 0)) as conn:
            conn.sendall(MAGIC + b" DONE " + me.encode() + b" " + token.encode() + b"\n")
    except OSError:
        pass


def _mtu_check(local_ip: str, peer_ip: str, port: int, mtu: int, timeout: float) -> dict[str, Any]:
    size = max(0, mtu - IPV4_UDP_OVERHEAD)
    result: dict[str, Any] = {"ok": False, "mtu": mtu, "payload": size, "error": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        sock.bind((local_ip, 0))
        payload = (MAGIC + b" MTU ") + os.urandom(max(0, size - len(MAGIC) - 5))
        payload = payload[:size]
        attempts = 3
        for _attempt in range(attempts):
            try:
                sock.sendto(payload, (peer_ip, port))
            except OSError as exc:
                if exc.errno == errno.EMSGSIZE:
                    result["error"] = "a %d-byte packet does not fit the local path MTU (EMSGSIZE)" % mtu
                    return result
                raise
            ready = select.select([sock], [], [], timeout / attempts)[0]
            if ready:
                data = sock.recvfrom(65535)[0]
                if data == payload:
                    result["ok"] = True
                    return result
        result["error"] = (
            "a %d-byte packet with don't-fragment set got no echo within %s (MTU mismatch on the path?)"
            % (mtu, _fmt_seconds(timeout))
        )
    except OSError as exc:
        result["error"] = exc.strerror or str(exc)
    finally:
        sock.close()
    return result


def _mgmt_check(mgmt_ip: Optional[str], port: int, timeout: float) -> dict[str, Any]:
    if not mgmt_ip:
        return {"address": None, "reachable": None, "detail": "peer management address unknown"}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect((mgmt_ip, port))
        return {"address": mgmt_ip, "reachable": True, "detail": "port %d accepted" % port}
    except ConnectionRefusedError:
        return {"address": mgmt_ip, "reachable": True, "detail": "port %d refused (host answers)" % port}
    except socket.timeout:
        return {"address": mgmt_ip, "reachable": False, "detail": "timed out after %s" % _fmt_seconds(timeout)}
    except OSError as exc:
        return {"address": mgmt_ip, "reachable": False, "detail": exc.strerror or str(exc)}
    finally:
        sock.close()


def probe_peer(
    me: str,
    interface: str,
    local_ip: str,
    peer: Mapping[str, Any],
    port: int,
    timeout: float,
    mtu: int,
    mgmt_port: int,
    mgmt_timeout: float,
    get_route: Callable[[str], Mapping[str, Any]] = route_get,
    listener_wait: float = 0.0,
    token: str = "",
) -> dict[str, Any]:
    peer_ip = str(peer["fabric_ip"])
    # The management check usually waits out its timeout (a peer's management address is unreachable on a
    # fabric-only cluster): run it beside the fabric checks, not after them.
    mgmt: dict[str, Any] = {}
    mgmt_thread = threading.Thread(
        target=lambda: mgmt.update(_mgmt_check(peer.get("mgmt_ip"), mgmt_port, mgmt_timeout)), daemon=True)
    mgmt_thread.start()
    try:
        route = dict(get_route(peer_ip))
        route_error = evaluate_route(route, interface, local_ip)
    except (OSError, subprocess.CalledProcessError, ValueError) as exc:
        route, route_error = {}, "ip route get %s failed: %s" % (peer_ip, exc)
    tcp = _tcp_check(local_ip, peer_ip, port, timeout, listener_wait)
    mtu_result = _mtu_check(local_ip, peer_ip, port, mtu, timeout) if tcp["ok"] else {
        "ok": False, "mtu": mtu, "payload": mtu - IPV4_UDP_OVERHEAD, "error": "skipped: TCP failed"}
    if tcp["ok"]:
        # Only after the MTU echo: the listener may exit on the last DONE.
        _say_done(local_ip, peer_ip, port, timeout, me, token)
    mgmt_thread.join()
    return {
        "host": str(peer["host"]),
        "fabric_ip": peer_ip,
        "route": {"dev": route.get("dev"), "src": route.get("prefsrc"), "ok": route_error is None,
                  "error": route_error},
        "tcp": tcp,
        "mtu": mtu_result,
        "mgmt": mgmt,
    }


def probe_peers(me: str, interface: str, local_ip: str, peers: Sequence[Mapping[str, Any]], **kwargs: Any) -> list:
    """Probe every peer in parallel (a 16-node cluster with one dead peer still takes ~timeout)."""
    if not peers:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(peers))) as pool:
        futures = [pool.submit(probe_peer, me, interface, local_ip, peer, **kwargs) for peer in peers]
        return [f.result() for f in futures]


# ---------------------------------------------------------------------------
# The all-pairs report (pure; runs on the controller)
# ---------------------------------------------------------------------------


def pair_problems(src: str, result: Mapping[str, Any]) -> list[str]:
    """Every problem of one src -> peer result, as `src -> peer (ip): what`."""
    label = "%s -> %s (%s)" % (src, result["host"], result["fabric_ip"])
    problems = []
    if not result["route"]["ok"]:
        problems.append("%s: %s" % (label, result["route"]["error"]))
    if not result["tcp"]["ok"]:
        problems.append("%s: %s" % (label, result["tcp"]["error"]))
    elif result["tcp"].get("answered_by") not in (None, result["host"]):
        problems.append(
            "%s: answered by %s, not %s (duplicate fabric address?)" % (label, result["tcp"]["answered_by"], result["host"])
        )
    elif not result["mtu"]["ok"]:
        problems.append("%s: %s" % (label, result["mtu"]["error"]))
    return problems


def assemble_report(
    results: Mapping[str, Any],
    hosts: Sequence[str],
    link_errors: Optional[Mapping[str, Optional[str]]] = None,
) -> dict[str, Any]:
    """All-pairs matrix from each host's probe result.

    ``results`` maps host -> its fabric_probe return (``peers`` list), or a
    dict with ``failed``/``msg`` when the host could not probe at all.
    ``link_errors`` (host -> message) come first: they explain the pairs after.
    """
    broken: list[str] = [msg for host in hosts for msg in [(link_errors or {}).get(host)] if msg]
    pairs: list[dict[str, Any]] = []
    mgmt: list[dict[str, Any]] = []
    for src in hosts:
        data = results.get(src)
        if not data or data.get("failed") or "peers" not in data:
            reason = (data or {}).get("msg") or "no probe result"
            for dst in hosts:
                if dst != src:
                    broken.append("%s -> %s: not probed (%s)" % (src, dst, reason))
            continue
        seen = set()
        for result in data["peers"]:
            seen.add(result["host"])
            problems = pair_problems(src, result)
            broken.extend(problems)
            pairs.append({
                "src": src,
                "dst": result["host"],
                "dst_fabric_ip": result["fabric_ip"],
                "ok": not problems,
                "rtt_ms": result["tcp"].get("rtt_ms"),
                "mtu_ok": result["mtu"]["ok"],
            })
            mgmt.append({"src": src, "dst": result["host"], **result["mgmt"]})
        for dst in hosts:
            if dst != src and dst not in seen:
                broken.append("%s -> %s: not probed (peer missing from the probe list)" % (src, dst))
    return {"ok": not broken, "broken": broken, "pairs": pairs, "mgmt": mgmt}


def peer_list(fabric_by_host: Mapping[str, Mapping[str, Any]], me: str) -> list[dict[str, Any]]:
    """The probe's peer list for ``me``: every other host's name, fabric and mgmt address."""
    return [
        {"host": host, "fabric_ip": fabric["ip"], "mgmt_ip": fabric.get("mgmt_ip")}
        for host, fabric in fabric_by_host.items()
        if host != me
    ]
