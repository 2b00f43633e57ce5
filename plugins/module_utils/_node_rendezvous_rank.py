# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The rank process of the distributed preflight (a node script).

This file is sent whole to the node's runtime interpreter as
``python -c <this source> <config json>`` (a venv's python, or
``docker exec <container> python``; ``_scripts.script_argv``), so it is
self-contained: standard library at the top, torch and vLLM imported inside
``main`` from the runtime. It never installs anything.

What one rank does, in order, under a hard deadline (a watchdog thread exits
the process at the deadline even where the module's kill cannot reach it,
e.g. inside a container):

1. records which interface Gloo (GLOO_SOCKET_IFNAME) and NCCL
   (NCCL_SOCKET_IFNAME, NCCL's own matching rules) will use and whether it
   carries this node's fabric address, and the route to the head;
2. imports torch, and calls vLLM's own ``get_ip()`` under this environment;
3. ``torch.distributed.init_process_group(backend,
   init_method="tcp://<head fabric ip>:<port>", rank, world_size, timeout)``
   as vLLM does (NCCL plus a Gloo group on GPU hosts, Gloo alone without);
4. all-reduces a known tensor (rank r contributes r + 1) and checks the sum;
5. times an all-reduce of a configurable size and reports algbw and busbw
   (busbw = algbw * 2 (n - 1) / n, as nccl-tests);
6. barrier, destroy the group, exit.

With NCCL it also keeps NCCL's own log lines that name the network (``nccl_log``):
the rank runs NCCL with ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS=INIT,NET`` into a
file of its own (``NCCL_DEBUG_FILE``, or the environment's own file where it sets
one), and ``_nccl_log`` reads which transport NCCL chose and on which HCAs.

After every step it prints one line ``MULTINODE_PREFLIGHT <json>`` with the
whole result so far; the module keeps the last one, so a rank killed at the
deadline still says how far it got.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback

MARKER = "MULTINODE_PREFLIGHT "

# NCCL's log: the lines kept (substrings of the messages _nccl_log reads), how many, and how long each may be.
NCCL_LOG_KEYS = ("NET/", "Using network", "NCCL version", " via NET", "NCCL_IB_", "NCCL_NET", "NCCL WARN")
NCCL_LOG_MAX_LINES = 300
NCCL_LOG_MAX_CHARS = 400

# linux/sockios.h, linux/if.h
SIOCGIFFLAGS = 0x8913
SIOCGIFADDR = 0x8915
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
IFF_RUNNING = 0x40

GLOO_VAR = "GLOO_SOCKET_IFNAME"
NCCL_VAR = "NCCL_SOCKET_IFNAME"


# ---------------------------------------------------------------------------
# Interfaces (no torch, no `ip` needed: a container may lack iproute2)
# ---------------------------------------------------------------------------


def _ioctl_ifreq(sock, request, name):
    return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name[:15].encode()))


def local_interfaces():
    """[{name, ipv4: [..], up, running, loopback}] in kernel index order.

    Addresses come from ``ip -j -4 addr`` when ``ip`` exists (all addresses),
    else from SIOCGIFADDR (the primary address only).
    """
    by_ip = {}
    try:
        import subprocess

        out = subprocess.run(
            ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
        for entry in json.loads(out):
            by_ip[entry["ifname"]] = [a["local"] for a in entry.get("addr_info", []) if a.get("family") == "inet"]
    except Exception:
        by_ip = None
    result = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            try:
                flags = struct.unpack("H", _ioctl_ifreq(sock, SIOCGIFFLAGS, name)[16:18])[0]
            except OSError:
                flags = 0
            if by_ip is not None:
                addrs = by_ip.get(name, [])
            else:
                try:
                    addrs = [socket.inet_ntoa(_ioctl_ifreq(sock, SIOCGIFADDR, name)[20:24])]
                except OSError:
                    addrs = []
            result.append(
                {
                    "name": name,
                    "ipv4": addrs,
                    "up": bool(flags & IFF_UP),
                    "running": bool(flags & IFF_RUNNING),
                    "loopback": bool(flags & IFF_LOOPBACK),
                }
            )
    return result


def gloo_selection(value, interfaces, fabric_ip, hostname_addresses=()):
    """What Gloo binds to for GLOO_SOCKET_IFNAME=value (a comma list of concrete names).

    Gloo ignores values of length <= 1 and then binds to the address the host
    name resolves to.
    """
    names = {i["name"]: i for i in interfaces}
    sel = {"variable": GLOO_VAR, "value": value, "interfaces": [], "addresses": [], "carries_fabric": False,
           "problem": None}
    if value is None or len(value) <= 1:
        addrs = list(hostname_addresses)
        sel["addresses"] = addrs
        sel["carries_fabric"] = fabric_ip in addrs
        sel["interfaces"] = [i["name"] for i in interfaces if set(i["ipv4"]) & set(addrs)]
        if not sel["carries_fabric"]:
            sel["problem"] = "%s is unset; Gloo binds to the address the host name resolves to (%s)" % (
                GLOO_VAR, ", ".join(addrs) or "none")
        return sel
    wanted = [n.strip() for n in value.split(",") if n.strip()]
    sel["interfaces"] = wanted
    problems = []
    for name in wanted:
        if name.startswith(("^", "=")):
            problems.append("%s takes concrete interface names, not NCCL's ^/= syntax (%r)" % (GLOO_VAR, name))
            continue
        iface = names.get(name)
        if iface is None:
            problems.append("interface %s does not exist on this node" % name)
            continue
        if not iface["ipv4"]:
            problems.append("interface %s has no IPv4 address" % name)
            continue
        sel["addresses"].append(iface["ipv4"][0])
    sel["carries_fabric"] = bool(sel["addresses"]) and all(a == fabric_ip for a in sel["addresses"])
    if not problems and not sel["carries_fabric"]:
        problems.append("%s=%s selects interface %s (%s), not the fabric address %s: Gloo binds its sockets "
                        "there, off the fabric" % (GLOO_VAR, value, ",".join(wanted), ", ".join(sel["addresses"]),
                                                   fabric_ip))
    sel["problem"] = "; ".join(problems) or None
    return sel


def _nccl_match(entries, name, exact):
    for entry in entries:
        entry = entry.split(":", 1)[0]
        if (exact and name == entry) or (not exact and name.startswith(entry)):
            return True
    return False


def _nccl_default_rank(name):
    """NCCL's preference when NCCL_SOCKET_IFNAME is unset: ib*, then any other name, then docker*, lo*, virbr*."""
    if name.startswith("ib"):
        return 0
    for rank, prefix in ((2, "docker"), (3, "lo"), (4, "virbr")):
        if name.startswith(prefix):
            return rank
    return 1


def nccl_selection(value, interfaces, fabric_ip):
    """The interface NCCL bootstraps on for NCCL_SOCKET_IFNAME=value.

    NCCL's rules (src/misc/socket.cc): a comma list of prefixes; a leading
    ``^`` excludes, a leading ``=`` matches exactly (``^=`` both, for the whole
    list); only interfaces that are up and running with an address are
    candidates; values of length <= 1 are ignored; unset, it prefers ``ib*``,
    then anything but docker/lo/virbr, then docker, lo, virbr. Bootstrap uses
    the first match.
    """
    sel = {"variable": NCCL_VAR, "value": value, "interface": None, "address": None, "carries_fabric": False,
           "problem": None}
    candidates = [i for i in interfaces if i["up"] and i["running"] and i["ipv4"]]
    chosen = None
    if value is None or len(value) <= 1:
        order = sorted(candidates, key=lambda i: _nccl_default_rank(i["name"]))  # stable: kernel order within a rank
        chosen = order[0] if order else None
    else:
        spec = value
        exclude = spec.startswith("^")
        if exclude:
            spec = spec[1:]
        exact = spec.startswith("=")
        if exact:
            spec = spec[1:]
        entries = [e for e in spec.split(",") if e]
        for iface in candidates:
            if _nccl_match(entries, iface["name"], exact) != exclude:
                chosen = iface
                break
    if chosen is None:
        sel["problem"] = "no up and running interface with an IPv4 address matches %s=%s" % (NCCL_VAR, value)
        return sel
    sel["interface"] = chosen["name"]
    sel["address"] = chosen["ipv4"][0]
    sel["carries_fabric"] = fabric_ip in chosen["ipv4"]
    if not sel["carries_fabric"]:
        sel["problem"] = "%s=%s selects interface %s (%s), not the fabric address %s" % (
            NCCL_VAR, value if value is not None else "<unset>", chosen["name"], ", ".join(chosen["ipv4"]), fabric_ip)
    return sel


def route_to(address, port, interfaces):
    """Source address and interface the kernel picks to reach address (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((address, port))
            source = sock.getsockname()[0]
    except OSError as exc:
        return {"source_ip": None, "interface": None, "error": str(exc)}
    names = [i["name"] for i in interfaces if source in i["ipv4"]]
    return {"source_ip": source, "interface": names[0] if names else None, "error": None}


def hostname_addresses():
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    seen = []
    for info in infos:
        if info[4][0] not in seen:
            seen.append(info[4][0])
    return seen


def get_ip_check(fabric_ip):
    """vLLM's own get_ip() under this environment (the import path depends on the vLLM version)."""
    result = {"source": None, "value": None, "vllm_version": None, "matches": None, "error": None}
    get_ip = None
    for module_name in ("vllm.utils.network_utils", "vllm.utils"):
        try:
            module = __import__(module_name, fromlist=["get_ip"])
            get_ip = getattr(module, "get_ip")
            result["source"] = module_name + ".get_ip"
            break
        except Exception as exc:  # ImportError, or a vLLM that fails to import
            result["error"] = "%s: %s" % (type(exc).__name__, exc)
    if get_ip is None:
        # A torch-only image: apply vLLM's rule (VLLM_HOST_IP, else the source
        # address towards 8.8.8.8) and say so.
        result["source"] = "emulated (vLLM is not importable in this runtime: %s)" % result["error"]
        value = os.environ.get("VLLM_HOST_IP") or ""
        if not value:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    sock.connect(("8.8.8.8", 80))
                    value = sock.getsockname()[0]
            except OSError:
                value = "0.0.0.0"
        result["value"] = value
        result["error"] = None
    else:
        try:
            import vllm  # noqa: F401  (already imported by the line above)

            result["vllm_version"] = getattr(sys.modules.get("vllm"), "__version__", None)
        except Exception:
            pass
        try:
            result["value"] = str(get_ip())
            result["error"] = None
        except Exception as exc:
            result["error"] = "%s: %s" % (type(exc).__name__, exc)
    result["matches"] = result["value"] == fabric_ip if result["value"] is not None else None
    return result


# ---------------------------------------------------------------------------
# NCCL's own log (the transport it chose)
# ---------------------------------------------------------------------------


def nccl_debug_settings(environ, workdir):
    """The NCCL_DEBUG* values the rank runs NCCL under, so that its log names the network.

    NCCL_DEBUG stays where it already says INFO or TRACE, else INFO; NCCL_DEBUG_SUBSYS stays where it already
    includes INIT and NET (or ALL), else INIT,NET; an NCCL_DEBUG_FILE already set is kept (the rank reads that
    file), else the log goes to a file in ``workdir``. Returns (the values to set, the file pattern).
    """
    settings = {}
    if (environ.get("NCCL_DEBUG") or "").upper() not in ("INFO", "TRACE"):
        settings["NCCL_DEBUG"] = "INFO"
    subsys = (environ.get("NCCL_DEBUG_SUBSYS") or "").upper()
    parts = set(p.strip() for p in subsys.split(","))
    if subsys.startswith("^") or not ("ALL" in parts or {"INIT", "NET"} <= parts):
        settings["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    pattern = environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        pattern = os.path.join(workdir, "nccl.log")
        settings["NCCL_DEBUG_FILE"] = pattern
    return settings, pattern


def read_nccl_log(pattern, pid=None, hostname=None):
    """The kept lines of NCCL's log file (NCCL replaces %h with the host name and %p with the pid)."""
    pid = os.getpid() if pid is None else pid
    host = (hostname or socket.gethostname()).split(".")[0]
    path = pattern.replace("%h", host).replace("%p", str(pid))
    if not os.path.exists(path):
        found = sorted(glob.glob(pattern.replace("%h", "*").replace("%p", str(pid))))
        if not found:
            return []
        path = found[-1]
    kept = []
    try:
        with open(path, errors="replace") as handle:
            for line in handle:
                if any(key in line for key in NCCL_LOG_KEYS):
                    kept.append(line.rstrip("\n")[:NCCL_LOG_MAX_CHARS])
                    if len(kept) >= NCCL_LOG_MAX_LINES:
                        break
    except OSError:
        return []
    return kept


# ---------------------------------------------------------------------------
# The rank
# ---------------------------------------------------------------------------


class Rank:
    def __init__(self, config):
        self.config = config
        self.start = time.time()
        self.lock = threading.Lock()
        self.result = {
            "host": config["host"],
            "rank": config["rank"],
            "world_size": config["world_size"],
            "pid": os.getpid(),
            "python": sys.executable,
            "phase": "start",
            "ok": False,
            "final": False,
            "error": None,
            "error_phase": None,
            "fabric_ip": config["fabric_ip"],
            "fabric_interface": config.get("fabric_interface"),
            "head_ip": config["head_ip"],
            "port": config["port"],
            "init_method": "tcp://%s:%d" % (config["head_ip"], config["port"]),
            "nccl_expect": config.get("nccl_expect") or {"transport": "none", "hcas": []},
            "timings": {},
        }
        self.nccl_pattern = None
        self.workdir = None

    def emit(self, **changes):
        if self.nccl_pattern is not None:
            changes.setdefault("nccl_log", read_nccl_log(self.nccl_pattern))
        with self.lock:
            self.result.update(changes)
            self.result["timings"]["elapsed_s"] = round(time.time() - self.start, 3)
            line = MARKER + json.dumps(self.result, sort_keys=True)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def remaining(self):
        return self.config["deadline"] - time.time()

    def watchdog(self):
        delay = max(0.0, self.remaining())

        def fire():
            self.emit(error="the rank did not finish before its deadline (%g s) in phase %s" % (
                self.config["timeout"], self.result["phase"]), error_phase=self.result["phase"], final=True)
            self.cleanup()
            os._exit(124)

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        timer.start()

    def cleanup(self):
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def nccl_debug(self):
        """Run NCCL with a log that names its transport (before NCCL reads its environment, at init)."""
        self.workdir = tempfile.mkdtemp(prefix="multinode-preflight-")
        settings, pattern = nccl_debug_settings(os.environ, self.workdir)
        os.environ.update(settings)
        self.nccl_pattern = pattern
        self.result["nccl_debug"] = {"set": settings, "file": pattern}

    def fail(self, exc):
        self.emit(error="%s: %s" % (type(exc).__name__, str(exc).strip()), error_phase=self.result["phase"],
                  traceback=traceback.format_exc()[-3000:], final=True)
        return 1

    def run(self):
        cfg = self.config
        self.watchdog()
        interfaces = local_interfaces()
        fabric_ip = cfg["fabric_ip"]
        self.emit(
            phase="interfaces",
            interfaces=interfaces,
            gloo=gloo_selection(os.environ.get(GLOO_VAR), interfaces, fabric_ip, hostname_addresses()),
            nccl=nccl_selection(os.environ.get(NCCL_VAR), interfaces, fabric_ip),
            route_to_head=route_to(cfg["head_ip"], cfg["port"], interfaces),
            vllm_host_ip=os.environ.get("VLLM_HOST_IP"),
        )
        self.emit(phase="import")
        t0 = time.time()
        try:
            import torch
            import torch.distributed as dist
        except Exception as exc:
            self.result["timings"]["import_s"] = round(time.time() - t0, 3)
            return self.fail(exc)
        cuda = bool(torch.cuda.is_available())
        backend = cfg.get("backend") or "auto"
        if backend == "auto":
            backend = "nccl" if cuda else "gloo"
        self.result["timings"]["import_s"] = round(time.time() - t0, 3)
        if backend == "nccl":
            self.nccl_debug()
        self.emit(torch_version=torch.__version__, cuda=cuda, backend=backend)

        if cfg.get("check_get_ip", True):
            self.emit(phase="get_ip")
            t0 = time.time()
            self.result["get_ip"] = get_ip_check(fabric_ip)
            self.result["timings"]["get_ip_s"] = round(time.time() - t0, 3)

        # All ranks share the absolute deadline; leave a little time to report.
        timeout = max(1.0, self.remaining() - cfg.get("reserve", 3.0))
        self.emit(phase="init", timeout_s=round(timeout, 1))
        t0 = time.time()
        import datetime

        try:
            if backend == "nccl":
                local_rank = int(cfg.get("local_rank", 0))
                torch.cuda.set_device(local_rank)
                device = torch.device("cuda", local_rank)
            else:
                device = torch.device("cpu")
            dist.init_process_group(
                backend=backend,
                init_method=self.result["init_method"],
                rank=cfg["rank"],
                world_size=cfg["world_size"],
                timeout=datetime.timedelta(seconds=timeout),
            )
            groups = [("default", None, device)]
            if backend == "nccl":
                # vLLM builds a Gloo CPU group beside the NCCL one.
                gloo_group = dist.new_group(ranks=list(range(cfg["world_size"])), backend="gloo",
                                            timeout=datetime.timedelta(seconds=timeout))
                groups.append(("gloo", gloo_group, torch.device("cpu")))
            self.result["backends"] = [backend] + (["gloo"] if backend == "nccl" else [])
            self.result["timings"]["init_s"] = round(time.time() - t0, 3)

            self.emit(phase="verify")
            n = cfg["world_size"]
            expected = float(n * (n + 1) // 2)
            checks = []
            for label, group, dev in groups:
                tensor = torch.full((1024,), float(cfg["rank"] + 1), dtype=torch.float32, device=dev)
                dist.all_reduce(tensor, group=group)
                got_min, got_max = float(tensor.min().item()), float(tensor.max().item())
                checks.append({"group": label, "expected": expected, "min": got_min, "max": got_max,
                               "ok": got_min == expected and got_max == expected})
            self.emit(verify={"ok": all(c["ok"] for c in checks), "groups": checks})
            if not all(c["ok"] for c in checks):
                self.emit(error="all-reduce returned a wrong sum: %s" % checks, error_phase="verify", final=True)
                return 2

            size = int(cfg.get("size_bytes", 0))
            if size > 0:
                self.emit(phase="bandwidth")
                self.result["bandwidth"] = self.bandwidth(torch, dist, device, size)
            self.emit(phase="barrier")
            dist.barrier()
            dist.destroy_process_group()
        except Exception as exc:
            return self.fail(exc)
        self.emit(phase="done", ok=True, final=True)
        return 0

    def bandwidth(self, torch, dist, device, size):
        cfg = self.config
        n = cfg["world_size"]
        elements = max(1, size // 4)
        tensor = torch.full((elements,), float(cfg["rank"] + 1), dtype=torch.float32, device=device)
        for _warmup in range(int(cfg.get("warmup", 1))):
            dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize()
        iterations = max(1, int(cfg.get("iterations", 5)))
        dist.barrier()
        t0 = time.perf_counter()
        for _iteration in range(iterations):
            dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / iterations
        algbw = elements * 4 / seconds / 1e9
        return {
            "bytes": elements * 4,
            "dtype": "float32",
            "iterations": iterations,
            "seconds_per_op": round(seconds, 6),
            "algbw_GBps": round(algbw, 4),
            "busbw_GBps": round(algbw * 2 * (n - 1) / n, 4),
        }


def main(argv=None):
    argv = sys.argv if argv is None else argv
    config = json.loads(argv[-1])
    rank = Rank(config)
    try:
        return rank.run()
    finally:
        rank.cleanup()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Skip interpreter teardown (torch's atexit handlers can stall on a broken group).
    os._exit(code)
