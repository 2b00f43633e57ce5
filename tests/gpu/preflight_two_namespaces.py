# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The distributed preflight module across two network namespaces: two "nodes" joined by a veth fabric.

Each namespace is one node (spark1 = head, rank 0; spark2 = worker, rank 1) with
``fabric0`` (a veth pair, 198.18.210.0/24) and ``mgmt0`` (a veth whose peer stays in the
root namespace with no address: 10.251.0.0/24, the default route, reaching no
other node, as the management network reached nothing in the incident). The module
(plugins/modules/distributed_preflight.py) runs in each namespace at once, as
Ansible runs it on each node, with the node environment the collection renders
(``_env.node_environment``, written with ``_env.env_file``); the cluster's
verdict comes from ``_rendezvous.assemble_report``, as the role's filter builds
it. Two scenarios:

- ``fabric``: the rendered environment. Must pass: every rank joins
  tcp://198.18.210.1:29600, the all-reduce sum is right (NCCL and vLLM's Gloo
  group with ``--backend nccl``), bandwidth reported.
- ``misconfigured``: spark2's ``NCCL_SOCKET_IFNAME`` overridden to ``=mgmt0``
  (``--backend nccl``) or its ``GLOO_SOCKET_IFNAME`` to ``mgmt0`` (gloo). Must
  fail within the deadline, the message naming spark2 and mgmt0.

On a GPU machine (``--backend nccl``) every rank gets NCCL_P2P_DISABLE=1 and
NCCL_SHM_DISABLE=1 (traffic crosses the socket transport as between hosts),
NCCL_IB_DISABLE=1, multicast off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) and NCCL_DEBUG=INFO
(its log lines naming the socket interface and the transport are kept). With
one GPU for both ranks (``--gpus 0,0``) each rank also gets its own
NCCL_HOSTID: NCCL refuses two ranks of one host on one GPU ("Duplicate GPU
detected") and its host identity is the hostname plus boot id, which two
namespaces share; a distinct NCCL_HOSTID makes them two hosts to NCCL, as two
machines are.

Needs root, pyroute2 (the device machine has no ``ip``) and ansible-core's
module_utils importable by ``--module-python``; torch comes from
``--interpreter``. Leaves nothing behind (the namespaces are removed).

  tests/gpu/preflight_two_namespaces.py --backend nccl --gpus 0,0 --out DIR       (one GPU)
  tests/gpu/preflight_two_namespaces.py --backend nccl --gpus 0,1 --out DIR       (two GPUs)
  tests/gpu/preflight_two_namespaces.py --backend gloo --interpreter PY --out DIR (CPU; the lab's node venv)

Exit status 0 when both scenarios came out as expected; the report
(DIR/report.json, DIR/summary.txt) says what each rank did.
"""

from __future__ import annotations

import argparse
import glob
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = os.path.join(REPO, "plugins", "modules", "distributed_preflight.py")
HOSTS = ("spark1", "spark2")
HEAD = "spark1"
NAMESPACE = {"spark1": "mnv-gpu-spark1", "spark2": "mnv-gpu-spark2"}
FABRIC_IF = "fabric0"
MGMT_IF = "mgmt0"
FABRIC = {"spark1": "198.18.210.1/24", "spark2": "198.18.210.2/24"}
FABRIC_CIDR = "198.18.210.0/24"
HEAD_IP = str(ipaddress.IPv4Interface(FABRIC[HEAD]).ip)
MGMT = {"spark1": "10.251.0.1/24", "spark2": "10.251.0.2/24"}
PORT = 29600
# Passed through to the ranks when set here (a container keeps its own environment; the module's rank gets only
# the env file and base_env, and the CUDA driver may be found through these).
PASSTHROUGH = ("LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")
NCCL_LINE_KEYS = ("NET/Socket", "via NET", "Using network", "NCCL_SOCKET_IFNAME", "Bootstrap", "bootstrap",
                  "NCCL version", "NCCL_HOSTID", "Duplicate GPU")


def _pyroute2():
    try:
        from pyroute2 import IPRoute, NetNS, netns
    except ImportError as exc:
        sys.exit("pyroute2 is needed to build the namespaces (%s); pip install pyroute2" % exc)
    return types.SimpleNamespace(IPRoute=IPRoute, NetNS=NetNS, netns=netns)


def lab_down():
    pr2 = _pyroute2()
    present = set(pr2.netns.listnetns())
    for name in NAMESPACE.values():
        if name in present:
            pr2.netns.remove(name)
    # The kernel frees a namespace (and the veths in it) later; the peers left here go now.
    with pr2.IPRoute() as ipr:
        for name in ("mnvgpu-a", "mnvgpu-b", "mnvgpu-ap", "mnvgpu-bp", "mnvgpu-am", "mnvgpu-bm"):
            for index in ipr.link_lookup(ifname=name):
                ipr.link("del", index=index)


def lab_up():
    """Two namespaces, fabric0 (one veth pair between them) and mgmt0 (default route, leads nowhere), lo up."""
    pr2 = _pyroute2()
    lab_down()
    for name in NAMESPACE.values():
        pr2.netns.create(name)
    with pr2.IPRoute() as ipr:
        ipr.link("add", ifname="mnvgpu-a", kind="veth", peer="mnvgpu-b")
        for host, tmp in zip(HOSTS, ("mnvgpu-a", "mnvgpu-b")):
            ipr.link("set", index=ipr.link_lookup(ifname=tmp)[0], net_ns_fd=NAMESPACE[host])
            # mgmt0's peer stays here, up, with no address: the node's management NIC leads nowhere.
            ipr.link("add", ifname=tmp + "m", kind="veth", peer=tmp + "p")
            ipr.link("set", index=ipr.link_lookup(ifname=tmp + "p")[0], state="up")
            ipr.link("set", index=ipr.link_lookup(ifname=tmp + "m")[0], net_ns_fd=NAMESPACE[host])
    for host, tmp in zip(HOSTS, ("mnvgpu-a", "mnvgpu-b")):
        with pr2.NetNS(NAMESPACE[host]) as ns:
            lo = ns.link_lookup(ifname="lo")[0]
            ns.link("set", index=lo, state="up")
            fab = ns.link_lookup(ifname=tmp)[0]
            ns.link("set", index=fab, ifname=FABRIC_IF)
            net = ipaddress.IPv4Interface(FABRIC[host])
            ns.addr("add", index=fab, address=str(net.ip), prefixlen=net.network.prefixlen)
            ns.link("set", index=fab, state="up")
            mgmt = ns.link_lookup(ifname=tmp + "m")[0]
            ns.link("set", index=mgmt, ifname=MGMT_IF)
            net = ipaddress.IPv4Interface(MGMT[host])
            ns.addr("add", index=mgmt, address=str(net.ip), prefixlen=net.network.prefixlen)
            ns.link("set", index=mgmt, state="up")
            ns.route("add", dst="0.0.0.0/0", oif=mgmt)


def enter(name, argv):
    """Run argv inside namespace ``name`` (what ``ip netns exec`` does for the network)."""
    _pyroute2().netns.setns(name)
    os.execvp(argv[0], argv)


def collections_root(work):
    """An ansible_collections tree whose multinode/vllm is this checkout (how Ansible finds module_utils)."""
    root = os.path.join(work, "collections")
    link = os.path.join(root, "ansible_collections", "multinode", "vllm")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.islink(link):
        os.symlink(REPO, link)
    return root


def node_envs(misconfigured, backend):
    from ansible_collections.multinode.vllm.plugins.module_utils._env import EnvSettings, node_environment
    from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricSelection

    settings = EnvSettings(fabric_cidr=FABRIC_CIDR, head_fabric_ip=HEAD_IP)
    envs = {}
    for host in HOSTS:
        selection = FabricSelection(host=host, interface=FABRIC_IF, address=ipaddress.IPv4Interface(FABRIC[host]),
                                    mtu=1500)
        overrides = {}
        if misconfigured and host == "spark2":
            # The per-host escape hatch, misused: the mistake the preflight must catch.
            overrides = {"NCCL_SOCKET_IFNAME": "=" + MGMT_IF} if backend == "nccl" else {"GLOO_SOCKET_IFNAME": MGMT_IF}
        envs[host] = node_environment(selection, settings, overrides)
    return envs


def run_scenario(args, scenario, work):
    from ansible_collections.multinode.vllm.plugins.module_utils._env import env_file, non_carry_over_keys
    from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import assemble_report

    misconfigured = scenario == "misconfigured"
    timeout = args.misconfigured_timeout if misconfigured else args.timeout
    envs = node_envs(misconfigured, args.backend)
    # The head's non-carry-over list is the one the correct deployment renders (the override is the mistake).
    nco = os.path.join(work, "ray_non_carry_over_env_vars.json")
    with open(nco, "w") as handle:
        json.dump(non_carry_over_keys(node_envs(False, args.backend)), handle)
    gpus = args.gpus.split(",")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [collections_root(work)] + [p for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p]))
    procs = {}
    for rank, host in enumerate(HOSTS):
        node_dir = os.path.join(work, scenario, host)
        os.makedirs(node_dir, exist_ok=True)
        with open(os.path.join(node_dir, "node.env"), "w") as handle:
            handle.write(env_file(envs[host]))
        base_env = {key: os.environ[key] for key in PASSTHROUGH if os.environ.get(key)}
        # The namespaces reach no DNS server; c10d's reverse lookups then wait glibc's 10 s each (as in the lab,
        # tests/integration/test_distributed_preflight.py).
        base_env["RES_OPTIONS"] = "timeout:1 attempts:1"
        if args.backend == "nccl":
            base_env.update({
                "CUDA_VISIBLE_DEVICES": gpus[rank],
                "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
                "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
                "NCCL_DEBUG_FILE": os.path.join(node_dir, "nccl.%p.log"),
            })
            if len(set(gpus)) < len(gpus):
                base_env["NCCL_HOSTID"] = "multinode-vllm-" + host
        module_args = {
            "host": host, "rank": rank, "world_size": len(HOSTS), "head_host": HEAD,
            "head_fabric_ip": HEAD_IP,
            "fabric_ip": str(ipaddress.IPv4Interface(FABRIC[host]).ip), "fabric_interface": FABRIC_IF,
            "port": PORT, "env_file": os.path.join(node_dir, "node.env"), "interpreter": [args.interpreter],
            "base_env": base_env, "backend": args.backend, "local_rank": 0,
            "timeout": timeout,
            "size_mib": args.size_mib, "iterations": args.iterations, "report_only": True,
            "non_carry_over_file": nco,
            # No vLLM on a bare GPU image: the rank applies vLLM's rule and says so.
            "check_get_ip": True,
        }
        args_file = os.path.join(node_dir, "args.json")
        with open(args_file, "w") as handle:
            json.dump({"ANSIBLE_MODULE_ARGS": module_args}, handle)
        cmd = [sys.executable, os.path.abspath(__file__), "--enter", NAMESPACE[host], "--",
               args.module_python, MODULE, args_file]
        procs[host] = (time.time(), subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                     text=True))
    returns, walls, raw = {}, {}, {}
    for host, (started, proc) in procs.items():
        out, err = proc.communicate()
        walls[host] = round(time.time() - started, 2)
        raw[host] = {"rc": proc.returncode, "stderr": err[-2000:]}
        try:
            returns[host] = json.loads(out)
        except ValueError:
            returns[host] = None
            raw[host]["stdout"] = out[-2000:]
    report = assemble_report(returns, HEAD, {h: FABRIC_IF for h in HOSTS}, timeout=timeout)
    nccl_lines = {}
    for host in HOSTS:
        lines = []
        for path in sorted(glob.glob(os.path.join(work, scenario, host, "nccl.*.log"))):
            with open(path, errors="replace") as handle:
                lines.extend(line.rstrip() for line in handle if any(k in line for k in NCCL_LINE_KEYS))
        nccl_lines[host] = lines[:40]
    return {"scenario": scenario, "report": report, "walls_s": walls, "module_returns": returns, "raw": raw,
            "nccl_log_lines": nccl_lines, "envs": envs}


def raw_tcp(args):
    """Raw TCP over the same veth, spark2 -> spark1 (tests/bench/tcp_throughput.py): the link's own speed."""
    tool = os.path.join(REPO, "tests", "bench", "tcp_throughput.py")
    enter_cmd = [sys.executable, os.path.abspath(__file__), "--enter"]
    recv = subprocess.Popen(enter_cmd + [NAMESPACE[HEAD], "--", sys.executable, tool, "recv", HEAD_IP, "29700"],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    send = subprocess.run(enter_cmd + [NAMESPACE["spark2"], "--", sys.executable, tool, "send", HEAD_IP, "29700",
                                       str(args.baseline_mib)], capture_output=True, text=True, timeout=120, check=False)
    out = recv.communicate(timeout=120)[0]
    return {"recv": json.loads(out.strip().splitlines()[-1]) if out.strip() else None,
            "send_rc": send.returncode, "send": send.stdout.strip()[-300:] or send.stderr.strip()[-300:]}


def judge(args, outcome):
    """What must hold; a list of unmet expectations."""
    report, misses = outcome["report"], []
    returns = outcome["module_returns"]
    if outcome["scenario"] == "fabric":
        if not report["ok"]:
            misses.append("the fabric scenario failed: %s" % report["problems"])
        for host in HOSTS:
            result = (returns.get(host) or {}).get("result") or {}
            expected = [args.backend] + (["gloo"] if args.backend == "nccl" else [])
            if result.get("backends") != expected:
                misses.append("%s ran backends %s, expected %s" % (host, result.get("backends"), expected))
            if not (result.get("verify") or {}).get("ok"):
                misses.append("%s: the all-reduce sum was not verified" % host)
            if not result.get("bandwidth"):
                misses.append("%s reported no bandwidth" % host)
            if args.backend == "nccl" and not any(FABRIC_IF in line for line in outcome["nccl_log_lines"][host]):
                misses.append("%s: no NCCL log line names %s" % (host, FABRIC_IF))
    else:
        limit = args.misconfigured_timeout + 3 + 15  # the deadline, the module's grace, Python and torch start-up
        if report["ok"]:
            misses.append("the misconfigured scenario passed")
        if not any("spark2" in p and MGMT_IF in p for p in report["problems"]):
            misses.append("no problem names spark2 and %s: %s" % (MGMT_IF, report["problems"]))
        slow = {h: w for h, w in outcome["walls_s"].items() if w > limit}
        if slow:
            misses.append("ranks outlived the deadline (%s s + grace): %s" % (args.misconfigured_timeout, slow))
    return misses


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--enter":
        return enter(sys.argv[2], sys.argv[4:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--gpus", default="0,0", help="CUDA device of spark1,spark2 (nccl)")
    parser.add_argument("--interpreter", default=sys.executable, help="the runtime's python (torch)")
    parser.add_argument("--module-python", default=sys.executable, help="a python with ansible-core")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--misconfigured-timeout", type=float, default=30.0)
    parser.add_argument("--size-mib", type=float, default=64.0)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--scenarios", default="fabric,misconfigured")
    parser.add_argument("--baseline-mib", type=float, default=0.0,
                        help="also time raw TCP over the fabric veth with this many MiB (0: skip)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="mnv-gpu-")
    sys.path.insert(0, collections_root(work))
    outcomes, misses, baseline = [], [], None
    try:
        lab_up()
        for scenario in args.scenarios.split(","):
            outcome = run_scenario(args, scenario, work)
            outcome["misses"] = judge(args, outcome)
            outcomes.append(outcome)
            misses.extend(outcome["misses"])
        baseline = raw_tcp(args) if args.baseline_mib > 0 else None
    finally:
        lab_down()
    with open(os.path.join(args.out, "report.json"), "w") as handle:
        json.dump({"backend": args.backend, "gpus": args.gpus, "outcomes": outcomes, "raw_tcp": baseline}, handle,
                  indent=1, sort_keys=True)
    lines = []
    for outcome in outcomes:
        report = outcome["report"]
        lines.append("== %s: %s (module wall time %s)" % (outcome["scenario"], "passed" if report["ok"] else "failed",
                                                          outcome["walls_s"]))
        lines.extend("  " + line for line in report.get("summary") or [])
        lines.extend("  problem: " + problem for problem in report["problems"])
        for host, nccl in outcome["nccl_log_lines"].items():
            lines.extend("  %s NCCL: %s" % (host, line) for line in nccl)
        lines.extend("  UNMET: " + miss for miss in outcome["misses"])
    if baseline and baseline["recv"]:
        lines.append("raw TCP over the same veth, spark2 -> spark1, %s MiB: %s GB/s" % (
            args.baseline_mib, baseline["recv"]["GBps"]))
    lines.append("expectations %s" % ("met" if not misses else "NOT met (%d)" % len(misses)))
    text = "\n".join(lines)
    with open(os.path.join(args.out, "summary.txt"), "w") as handle:
        handle.write(text + "\n")
    print(text)
    return 0 if not misses else 1


if __name__ == "__main__":
    sys.exit(main())
