# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Distributed preflight: read the rank outputs and say what is wrong, on which pair, with which value.

Pure: no Ansible imports, no I/O. The rank process itself is the node script
``_node_rendezvous_rank.py`` (run by the node's runtime interpreter); this module
parses what it printed (``parse_rank_output``), turns one rank's result into
messages (``rank_problems``), the results of every rank into the cluster's
messages (``cluster_problems``), and checks the environment carry-over
hazard (``carry_over_problems``, over ``_env.carry_over_hazards``). NCCL's
transport (NET/IB on the fabric port's HCAs) and the all-reduce busbw floor
are judged by ``_nccl_log``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._env import (
    CARRIED_PREFIXES,
    NON_CARRY_OVER_FILE,
    carry_over_hazards,
)
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._nccl_log import (
    busbw_problem,
    parse_nccl_log,
    transport_line,
    transport_problems,
)
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import EnvFileError
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import parse_env_file as parse_env_text
from ansible_collections.multinode.vllm.plugins.module_utils._node_rendezvous_rank import MARKER

# Keys of the node environment the module returns to the controller: what the
# cluster checks need, never the rest (the env file may hold tokens).
RETURNED_KEYS = ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "VLLM_CONFIG_ROOT")
RETURNED_PREFIXES = ("NCCL_", "UCX_")

# Phases of a rank, in order (see _node_rendezvous_rank.Rank.run).
PHASES = ("start", "interfaces", "import", "get_ip", "init", "verify", "bandwidth", "barrier", "done")

BACKENDS = ("auto", "gloo", "nccl")

# The environment under a node env file for the processes the checks start (the env file wins).
MINIMAL_BASE = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                "LANG": "C.UTF-8"}
# Phases in which a failure is a failure of the rendezvous itself.
RENDEZVOUS_PHASES = ("init", "verify", "bandwidth", "barrier")


class RendezvousError(MultinodeError):
    """Bad input to the preflight (unreadable env file, bad parameters); the message says which and why."""


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def parse_env_file(text: str, path: str = "env file") -> dict[str, str]:
    """The variables of a node's env file, by the launcher's rules (``_node_env_exec.parse_env_file``, the one
    env-file parser: docker ``--env-file``'s, values literal); a bad line is an error naming the file and the line.
    """
    try:
        return parse_env_text(text, path)
    except EnvFileError as exc:
        raise RendezvousError(str(exc))


def returned_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a node's environment the controller needs for the cluster checks."""
    return {k: v for k, v in env.items() if k in RETURNED_KEYS or k.startswith(RETURNED_PREFIXES)}


def rank_environment(env: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    """The rank's process environment: the minimal base, then every key of the node's env file."""
    merged = {str(k): str(v) for k, v in base.items()}
    merged.update({str(k): str(v) for k, v in env.items()})
    return merged


def parse_non_carry_over(text: str, path: str) -> list[str]:
    """vLLM's ray_non_carry_over_env_vars.json: a JSON list of variable names."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RendezvousError("%s is not valid JSON: %s" % (path, exc))
    if not isinstance(data, list) or not all(isinstance(k, str) for k in data):
        raise RendezvousError("%s must be a JSON list of variable names; got %r" % (path, data))
    return list(data)


def parse_marked(stdout: str, marker: str) -> Optional[dict[str, Any]]:
    """The last ``<marker><json>`` line a helper process printed (each line is the whole result so far)."""
    last = None
    for line in stdout.splitlines():
        if line.startswith(marker):
            try:
                last = json.loads(line[len(marker):])
            except ValueError:
                continue
    return last


def parse_rank_output(stdout: str) -> Optional[dict[str, Any]]:
    """The last ``MULTINODE_PREFLIGHT <json>`` line a rank printed."""
    return parse_marked(stdout, MARKER)


def bandwidth_summary(results: Mapping[str, Optional[Mapping[str, Any]]]) -> Optional[dict[str, Any]]:
    """The cluster's all-reduce bandwidth: the slowest rank's (all ranks time the same collective), with its host."""
    rows = [(h, r["bandwidth"]) for h, r in sorted(results.items()) if r and r.get("bandwidth")]
    if not rows:
        return None
    host, slowest = min(rows, key=lambda row: row[1]["algbw_GBps"])
    return dict(slowest, ranks=len(rows), host=host)


def nccl_used(result: Optional[Mapping[str, Any]]) -> bool:
    """Whether this rank ran NCCL (its log is then read for the transport)."""
    return bool(result) and "nccl" in (result.get("backends") or [result.get("backend")])


def nccl_transport(result: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """What NCCL's log says about this rank's network (``_nccl_log.parse_nccl_log``); None without NCCL."""
    if not result or not nccl_used(result) or result.get("nccl_log") is None:
        return None
    return parse_nccl_log(result.get("nccl_log") or [])


def nccl_transport_problems(result: Optional[Mapping[str, Any]], host: str) -> list[str]:
    """NET/IB on the fabric port's HCAs, when the rank was told to expect it and finished (else other messages
    say what went wrong first)."""
    expect = (result or {}).get("nccl_expect") or {}
    parsed = nccl_transport(result)
    if parsed is None or not result or not result.get("ok") or int(result.get("world_size") or 1) < 2:
        return []
    return transport_problems(host, parsed, expect.get("transport") or "none", expect.get("hcas") or [])


# ---------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------


def _iface_phrase(result: Mapping[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(interface, variable) this rank's rendezvous traffic was told to use, when it is off the fabric."""
    gloo = result.get("gloo") or {}
    nccl = result.get("nccl") or {}
    backends = result.get("backends") or [result.get("backend") or "gloo"]
    if gloo and not gloo.get("carries_fabric"):
        names = ",".join(gloo.get("interfaces") or []) or "<hostname address %s>" % ",".join(gloo.get("addresses") or [])
        return names, "GLOO_SOCKET_IFNAME"
    if "nccl" in backends and nccl and not nccl.get("carries_fabric"):
        return nccl.get("interface") or "<none>", "NCCL_SOCKET_IFNAME"
    return None, None


def _rendezvous(result: Mapping[str, Any]) -> str:
    return "%s:%s" % (result.get("head_ip"), result.get("port"))


def _timed_out(error: str) -> bool:
    text = error.lower()
    return "timed out" in text or "timeout" in text or "deadline" in text


def rank_problems(result: Optional[Mapping[str, Any]], host: str, fabric_interface: Optional[str] = None,
                  timeout: Optional[float] = None) -> list[str]:
    """Messages for one rank's result (None: the rank printed nothing)."""
    if not result:
        return ["%s: the preflight rank printed no result (killed at the %s s deadline before it started?)" % (
            host, timeout if timeout is not None else "?")]
    problems: list[str] = []
    fabric_if = result.get("fabric_interface") or fabric_interface or "?"
    fabric_ip = result.get("fabric_ip")
    for key in ("gloo", "nccl"):
        sel = result.get(key) or {}
        if key == "nccl" and "nccl" not in (result.get("backends") or [result.get("backend")]):
            continue
        if sel.get("problem") and not sel.get("carries_fabric"):
            problems.append("%s: %s; the fabric interface is %s (%s)" % (host, sel["problem"], fabric_if, fabric_ip))
    route = result.get("route_to_head") or {}
    if route.get("interface") and route.get("interface") != fabric_if:
        problems.append("%s: the route to the rendezvous %s leaves through %s (source %s), not the fabric "
                        "interface %s" % (host, result.get("head_ip"), route["interface"], route.get("source_ip"),
                                          fabric_if))
    get_ip = result.get("get_ip") or {}
    if get_ip.get("matches") is False:
        problems.append("%s: vLLM's get_ip() (%s) returns %s under this node's environment, not the fabric address "
                        "%s; set VLLM_HOST_IP=%s in the node environment" % (
                            host, get_ip.get("source"), get_ip.get("value"), fabric_ip, fabric_ip))
    elif get_ip.get("error"):
        problems.append("%s: vLLM's get_ip() failed: %s" % (host, get_ip["error"]))
    error = result.get("error")
    if error and result.get("error_phase") == "import":
        problems.append("%s: torch is not importable by the runtime's interpreter %s (%s); the runtime must "
                        "provide torch, the preflight does not install it" % (host, result.get("python"), error))
    elif error and result.get("error_phase") == "verify" and (result.get("verify") or {}).get("ok") is False:
        # A wrong sum only (the rank records the checked sums before it fails); a rank that hung or raised in
        # verify is the rendezvous message's to explain.
        problems.append("%s: %s" % (host, error))
    problems.extend(nccl_transport_problems(result, host))
    return problems


def _pair_message(host: str, result: Mapping[str, Any], head: str, timeout: Optional[float]) -> str:
    """Why ``host`` (not the head) failed the rendezvous, naming address, port and interface."""
    iface, variable = _iface_phrase(result)
    fabric_if = result.get("fabric_interface") or "?"
    where = _rendezvous(result)
    error = result.get("error") or ""
    phase = result.get("error_phase") or result.get("phase")
    if iface and variable == "NCCL_SOCKET_IFNAME" and phase != "init":
        # The group formed (the TCPStore and Gloo are on the fabric); NCCL's own sockets are not
        # (seen on an H200 with NCCL 2.28: the first all-reduce hangs until the deadline).
        return ("%s joined the rendezvous at %s, but NCCL's connections from interface %s (%s) did not reach the "
                "other ranks (phase %s: %s); the fabric interface is %s" % (
                    host, where, iface, variable, phase, error, fabric_if))
    if iface:
        return "%s could not reach the rendezvous at %s from interface %s (%s); the fabric interface is %s" % (
            host, where, iface, variable, fabric_if)
    route = result.get("route_to_head") or {}
    via = route.get("interface") or fabric_if
    if "refused" in error.lower():
        return ("%s could not reach the rendezvous at %s from interface %s: connection refused (nothing listens on "
                "port %s on %s; did %s's rank start?)" % (host, where, via, result.get("port"), head, head))
    if phase == "init" and _timed_out(error):
        return ("%s could not reach the rendezvous at %s from interface %s within %s s: port %s on %s's fabric "
                "address does not answer (a firewall dropping it?)" % (
                    host, where, via, result.get("timeout_s") or timeout, result.get("port"), head))
    return "%s failed the rendezvous at %s from interface %s in phase %s: %s" % (host, where, via, phase, error)


def cluster_problems(
    results: Mapping[str, Optional[Mapping[str, Any]]],
    head: str,
    fabric_interfaces: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
) -> list[str]:
    """Every rank's result -> the messages the preflight fails with; empty means it passed.

    The cause comes first (the rank whose interface or route is off the
    fabric, the port that does not answer), then what the other ranks saw.
    """
    fabric_interfaces = fabric_interfaces or {}
    causes: list[str] = []
    static: list[str] = []
    effects: list[str] = []
    failed = {h for h, r in results.items() if not r or not r.get("ok")}
    for host in sorted(results, key=lambda h: (h != head, h)):
        result = results[host]
        static.extend(rank_problems(result, host, fabric_interfaces.get(host), timeout))
        if not result or result.get("ok"):
            continue
        phase = result.get("error_phase") or result.get("phase")
        if phase not in RENDEZVOUS_PHASES:
            # Failed before it tried the rendezvous (no torch, a bad interpreter):
            # rank_problems said why when it knows; otherwise say it here.
            if phase != "import":
                effects.append("%s: the rank failed in phase %s before the rendezvous: %s" % (
                    host, phase, result.get("error")))
            continue
        if host != head:
            causes.append(_pair_message(host, result, head, timeout))
            continue
        others = sorted(h for h in failed - {head}
                        if not results.get(h) or (results[h].get("error_phase") or results[h].get("phase"))
                        in RENDEZVOUS_PHASES)
        iface, variable = _iface_phrase(result)
        if iface:
            causes.append("%s (rank 0) could not serve the rendezvous at %s from interface %s (%s); the fabric "
                          "interface is %s" % (head, _rendezvous(result), iface, variable,
                                               result.get("fabric_interface") or "?"))
        else:
            effects.append("%s (rank 0, the rendezvous at %s) failed in phase %s%s: %s" % (
                head, _rendezvous(result), phase, " waiting for %s" % ", ".join(others) if others else "",
                result.get("error")))
    ordered: list[str] = []
    for message in causes + static + effects:
        if message not in ordered:
            ordered.append(message)
    return ordered


# ---------------------------------------------------------------------------
# Environment carry-over (vLLM copies the head's NCCL_*/UCX_* to Ray workers)
# ---------------------------------------------------------------------------


def carry_over_problems(
    envs: Mapping[str, Mapping[str, str]],
    listed: Optional[Sequence[str]],
    head: str,
    path: str,
) -> list[str]:
    """NCCL_*/UCX_* keys that differ between hosts and are missing from the head's non-carry-over list.

    ``listed`` is None when the head has no such file: every differing key is
    then a problem.
    """
    hazards = carry_over_hazards(envs, list(listed or []))
    if hazards and listed is None:
        return ["%s: %s does not exist, so vLLM copies every %s value from the head; %s" % (
            head, path, "/".join(p.rstrip("_") + "_*" for p in CARRIED_PREFIXES), h) for h in hazards]
    return ["%s (%s on %s)" % (h, path, head) if NON_CARRY_OVER_FILE in h else h for h in hazards]


# ---------------------------------------------------------------------------
# The controller's view
# ---------------------------------------------------------------------------


def assemble_report(
    returns: Mapping[str, Optional[Mapping[str, Any]]],
    head: str,
    fabric_interfaces: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    min_busbw_gbps: Optional[float] = None,
    fabrics: Optional[Mapping[str, Mapping[str, Any]]] = None,
    size_mib: Optional[float] = None,
) -> dict[str, Any]:
    """Every host's module return (None: no return, e.g. unreachable) -> the cluster's verdict.

    Returns ``ok``, ``problems`` (cause first), ``bandwidth`` (the slowest
    rank's), ``ranks`` (one summary row per host) and ``elapsed`` (the
    slowest rank's seconds). With ``min_busbw_gbps`` (GB/s; None or 0: off)
    a cluster whose ranks all passed also fails when the slowest rank's busbw
    is below it, naming the likely causes from ``fabrics`` (each host's
    ``multinode_fabric``), the NCCL logs and the NCCL_* environment.
    """
    results: dict[str, Optional[Mapping[str, Any]]] = {}
    envs: dict[str, Mapping[str, str]] = {}
    problems: list[str] = []
    for host, ret in returns.items():
        if not ret:
            results[host] = None
            continue
        results[host] = ret.get("result")
        if ret.get("env") is not None:
            envs[host] = ret["env"]
    problems.extend(cluster_problems(results, head, fabric_interfaces, timeout))
    head_ret = returns.get(head) or {}
    if len(envs) > 1:
        problems.extend(carry_over_problems(
            envs, head_ret.get("non_carry_over"), head,
            head_ret.get("non_carry_over_file") or NON_CARRY_OVER_FILE))
    bandwidth = bandwidth_summary(results)
    if results and all(r and r.get("ok") for r in results.values()):
        parsed = {h: p for h, p in ((h, nccl_transport(r)) for h, r in results.items()) if p is not None}
        slow = busbw_problem(bandwidth, min_busbw_gbps, parsed, fabrics or {}, envs, size_mib)
        if slow:
            problems.append(slow)
    ranks = []
    for host in sorted(returns, key=lambda h: (h != head, h)):
        r = results.get(host) or {}
        ret = returns.get(host) or {}
        parsed_rank = nccl_transport(r)
        ranks.append({
            "host": host,
            "rank": r.get("rank"),
            "ok": bool(r.get("ok")),
            "phase": r.get("phase"),
            "backends": r.get("backends") or ([r["backend"]] if r.get("backend") else []),
            "gloo_interface": ",".join((r.get("gloo") or {}).get("interfaces") or []) or None,
            "nccl_interface": (r.get("nccl") or {}).get("interface"),
            "get_ip": (r.get("get_ip") or {}).get("value"),
            "elapsed": ret.get("elapsed"),
            "killed": ret.get("killed"),
            "nccl_transport": transport_line(parsed_rank) if parsed_rank is not None else None,
            "nccl_version": (parsed_rank or {}).get("version"),
        })
    elapsed = [row["elapsed"] for row in ranks if row["elapsed"] is not None]
    return {
        "ok": not problems,
        "problems": problems,
        "bandwidth": bandwidth,
        "ranks": ranks,
        "elapsed": max(elapsed) if elapsed else None,
        "summary": [summary_line(row) for row in ranks] + [bandwidth_line(bandwidth)],
    }


def summary_line(row: Mapping[str, Any]) -> str:
    return "%s rank %s %s (phase %s) backends %s gloo %s nccl %s get_ip %s, %s s%s%s" % (
        row["host"], row["rank"], "ok" if row["ok"] else "FAILED", row["phase"],
        "+".join(row["backends"]) or "-", row["gloo_interface"] or "-", row["nccl_interface"] or "-",
        row["get_ip"] or "-", row["elapsed"], ", killed at the deadline" if row.get("killed") else "",
        "; NCCL %s%s" % (row["nccl_transport"], " (NCCL %s)" % row["nccl_version"] if row.get("nccl_version") else "")
        if row.get("nccl_transport") else "")


def bandwidth_line(bandwidth: Optional[Mapping[str, Any]]) -> str:
    if not bandwidth:
        return "no all-reduce bandwidth measured"
    return "all-reduce of %.1f MiB float32 over %d ranks: %.1f ms per op, algbw %.3f GB/s, busbw %.3f GB/s" % (
        bandwidth["bytes"] / 1048576.0, bandwidth["ranks"], bandwidth["seconds_per_op"] * 1000,
        bandwidth["algbw_GBps"], bandwidth["busbw_GBps"])


# ---------------------------------------------------------------------------
# Reusing a proof (deploy re-runs): what a pass depended on, and whether it still holds
# ---------------------------------------------------------------------------

# The parameters a rank's outcome depends on. The deadline, sizes and iterations
# only shape the measurement, so a pass under other values still proves the rendezvous.
# What the gate expects of NCCL (transport, HCAs, busbw floor) is part of it: a pass under a weaker gate is not
# reused for a stricter one.
FINGERPRINT_PARAMS = ("rank", "world_size", "head_fabric_ip", "fabric_ip", "fabric_interface", "port", "interpreter",
                      "base_env", "backend", "local_rank", "check_get_ip", "nccl_expect_transport",
                      "nccl_expect_hcas", "min_busbw_gbps")


def node_fingerprint(params: Mapping[str, Any], env_text: str, non_carry_over_text: Optional[str],
                     versions: Mapping[str, Any]) -> str:
    """sha256 over everything one node's rank outcome depends on, apart from the network itself.

    The env file is hashed whole (the rank's environment is exactly its contents
    over the base), with the runtime's torch/vLLM/Ray versions and the
    addresses and interface; the fabric probe re-checks the network on every run.
    """
    material = {
        "params": {k: params.get(k) for k in FINGERPRINT_PARAMS},
        "env": hashlib.sha256(env_text.encode()).hexdigest(),
        "non_carry_over": None if non_carry_over_text is None else hashlib.sha256(non_carry_over_text.encode()).hexdigest(),
        "versions": dict(versions),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def cluster_fingerprint(node_fingerprints: Mapping[str, str]) -> str:
    """One value for the whole cluster: a pass proves the rendezvous of exactly these nodes with these inputs."""
    return hashlib.sha256(json.dumps(sorted(node_fingerprints.items())).encode()).hexdigest()


def parse_proof(text: Optional[str]) -> Optional[dict[str, Any]]:
    """The proof file's content; None when absent or unreadable (a broken proof is no proof)."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("cluster_fingerprint"), str):
        return None
    return data


def proof_reusable(proofs: Mapping[str, Optional[Mapping[str, Any]]], fingerprints: Mapping[str, str],
                   max_age: float) -> tuple[bool, str]:
    """Whether every node holds a proof of this very cluster fingerprint, younger than max_age seconds.

    Returns (reusable, reason); the reason names the first host that forces a new run.
    """
    if not fingerprints:
        return False, "no node to prove"
    cluster = cluster_fingerprint(fingerprints)
    for host in sorted(fingerprints):
        proof = proofs.get(host)
        if not proof:
            return False, "%s holds no proof of a previous pass" % host
        if proof.get("cluster_fingerprint") != cluster:
            return False, ("%s: something the rendezvous depends on changed since the last pass (its env file, the "
                           "runtime's torch/vLLM/Ray versions, an address, interface or port, or the set of nodes)"
                           % host)
        age = proof.get("age_s")
        if age is None or float(age) > max_age:
            return False, "%s: the last pass is older than %g s" % (host, max_age)
    return True, "nothing the rendezvous depends on changed since the last pass on all %d nodes" % len(fingerprints)
