# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Doctor's diagnosis: what every node's collected facts say, as ``symptom -> cause -> fix`` lines, most likely first.

The rules are the checks verify, preflight and readiness run (``_fabric.cluster_problems``/``link_problem``,
``_ray_state.evaluate_problems``, ``_stack.stack_problems``, ``_bind_audit.listener_problems``,
``_serve_failure.likely_cause``/``cause_problem``, ``_nccl_log.transport_problems``), applied to what doctor
collected, plus the few only doctor can see (SSH, a stopped raylet, a crashed vllm serve, a full disk, a firewall
rule, the env file's interface names). Each rule is a function of the collected facts returning ``Problem``s;
``WEIGHTS`` says how likely each rule id is the root cause, so a fault's consequences (a dead Ray node after a
link went down, a crashed vLLM after a raylet stopped) come after it.

Diagnose first, redact after (``report``): redaction must not hide a cause.

The collected facts (``collected``), every part optional but ``cluster`` and ``nodes``; where each shape comes from:

    cluster:
      fabric_cidr: 198.18.200.0/24
      head: spark1                      # multinode_cluster.head
      hosts: {spark1: {fabric_ip, mgmt_ip, fabric_interface}}   # the inventory (fabric_interface optional)
      backend: ray | native             # multinode_cluster.backend
      serve: true                       # multinode_cluster.serve: vllm serve should be running
      ports: {ray_gcs_port: 6379, vllm_api_port: 8000, min_worker_port: 10002, max_worker_port: 19999, ...}
      firewall_enabled: true            # the collection's nft table should be loaded
      fabric_expected_mtu: 9000         # optional
      required_gpus: 0                  # tensor_parallel_size * pipeline_parallel_size (0: not checked)
      stack_allow_skew: []              # ray_stack_allow_skew
      disk_min_free_bytes: 1073741824   # optional; default min(1 GiB, 2% of the disk)
    nodes:
      spark1:
        ssh_unreachable: false          # true: nothing else could be read (ssh_error says why)
        ssh_error: "..."
        system: {kernel, os}            # shown, not judged
        stack: {...}                    # multinode_stack (stack_facts), with image_id / model_manifest
        network: {...}                  # multinode_network (fabric_facts): raw interfaces, RDMA ports, GID tables
        fabric: {...}                   # multinode_fabric (fabric_facts), used when network is absent
        env_file: {NCCL_SOCKET_IFNAME: "=enp1s0f1np1", GLOO_SOCKET_IFNAME: ..., UCX_NET_DEVICES: ..., ...}
        ray_node: {...}                 # multinode_ray_node (ray_node_facts): running, env, serve_pid, ...
        ray_table: {nodes: [...], error: null}  # the head only: ray_verify's nodes (Ray's node table)
        listeners: [...]                # bind_audit's listeners, judged (verdict, reason, message)
        firewall: {ruleset: "<nft list ruleset>"}  # ruleset null: nft could not be read
        processes: [...], memory: {...} # shown, not judged
        disk: {path, free_bytes, total_bytes}      # the filesystem of multinode_model_dir
        logs: {ray: [lines], vllm: [lines]}        # last lines of each log
        nccl: [lines]                   # the NCCL transport lines of the last preflight (_nccl_log.kept_lines)

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._bind_audit import (
    AuditError,
    check_allow,
    classify,
    compile_patterns,
    listener_problems,
)
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    FabricSelection,
    cluster_problems,
    link_problem,
    parse_cidr,
    parse_network,
    select_fabric,
)
from ansible_collections.multinode.vllm.plugins.module_utils._firewall import TABLE as FIREWALL_TABLE
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import human_bytes
from ansible_collections.multinode.vllm.plugins.module_utils._memory import GIB
from ansible_collections.multinode.vllm.plugins.module_utils._nccl_log import parse_nccl_log, transport_problems
from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem, lines, ordered
from ansible_collections.multinode.vllm.plugins.module_utils._ray_state import evaluate_problems
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import redact_data
from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import (
    cause_problem,
    fatal_line,
    first_exception,
    likely_cause,
    meaningful_line,
    serve_starts,
    since_ready,
)
from ansible_collections.multinode.vllm.plugins.module_utils._stack import StackError, stack_problems

# How likely each rule is the root cause (higher first). A rule that explains others outranks them: nothing is
# known of a node SSH cannot reach; a link down, a wrong MTU or a dropped port make Ray nodes die and vLLM crash.
WEIGHTS: dict[str, int] = {
    "ssh_unreachable": 100,
    "fabric_cidr": 100,
    "fabric_link_down": 95,
    "fabric_unusable": 93,
    "ray_not_on_fabric": 90,
    "fabric_is_mgmt": 90,
    "model_disk_full": 88,
    "vllm_disk_full": 87,
    "fabric_mtu_mismatch": 85,
    "fabric_mtu_expected": 84,
    "fabric_ip_shared": 84,
    "firewall_port_dropped": 80,
    "fabric_ip_mismatch": 80,
    "fabric_outside_cidr": 80,
    "firewall_api_port_closed": 78,
    "env_ifname_not_fabric": 75,
    "ray_auth_off": 74,
    "ray_auth_token_missing": 74,
    "ray_auth_token_differs": 74,
    "vllm_host_ip_wrong": 72,
    "vllm_host_ip_shared": 72,
    "vllm_host_ip_missing": 71,
    "raylet_stopped": 70,
    "ray_node_duplicate": 69,
    "ray_node_unregistered": 68,
    "ray_node_dead": 67,
    "ray_node_count": 66,
    "stack_skew": 65,
    "ray_table_unreadable": 62,
    "fabric_prefix": 60,
    "vllm_crashed": 60,
    "nccl_transport": 55,
    "ray_node_unknown": 55,
    "ray_gpus": 50,
    "inventory_heads": 50,
    "firewall_table_absent": 45,
    "bind_not_fabric": 40,
}
# A vLLM failure cause of _serve_failure.CAUSES (rule vllm_<key>) not named above: a consequence more often than a
# root cause (a specific signature a little above the generic traceback).
VLLM_CAUSE_WEIGHT = 61
DEFAULT_WEIGHT = 50
DOCTOR = "run playbooks/doctor.yml again after the fix"
IFNAME_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@dataclass
class Context:
    """What every rule reads: the collected facts and each reachable node's fabric, chosen once."""

    cluster: Mapping[str, Any]
    nodes: Mapping[str, Mapping[str, Any]]
    selections: dict[str, FabricSelection] = field(default_factory=dict)
    fabric_errors: dict[str, str] = field(default_factory=dict)

    @property
    def head(self) -> Optional[str]:
        return self.cluster.get("head")

    @property
    def hosts(self) -> Mapping[str, Mapping[str, Any]]:
        return self.cluster.get("hosts") or {}

    def reachable(self) -> list[str]:
        return sorted(h for h, node in self.nodes.items() if not node.get("ssh_unreachable"))

    def node(self, host: str) -> Mapping[str, Any]:
        return self.nodes.get(host) or {}


def context(collected: Mapping[str, Any]) -> Context:
    """The rules' input: the fabric of each reachable node chosen by ``select_fabric`` (as fabric_facts does, a
    down link kept as ``link_error``) from its raw network, or rebuilt from its ``multinode_fabric``."""
    ctx = Context(cluster=collected.get("cluster") or {}, nodes=collected.get("nodes") or {})
    cidr = ctx.cluster.get("fabric_cidr")
    for host in ctx.reachable():
        node = ctx.node(host)
        wanted = ctx.hosts.get(host) or {}
        try:
            if node.get("network"):
                ctx.selections[host] = select_fabric(
                    host, parse_network(node["network"]), cidr, fabric_ip=wanted.get("fabric_ip"),
                    fabric_interface=wanted.get("fabric_interface"), allow_link_down=True)
            elif node.get("fabric"):
                ctx.selections[host] = FabricSelection.from_dict(node["fabric"])
        except FabricError as exc:
            ctx.fabric_errors[host] = str(exc)
    return ctx


# ---------------------------------------------------------------------------
# The rules: each reads the context and returns Problems
# ---------------------------------------------------------------------------


def rule_ssh_unreachable(ctx: Context) -> list[Problem]:
    """A node SSH cannot reach: nothing else is known of it (``ssh_unreachable``)."""
    return [Problem("ssh_unreachable", "SSH to the node failed (%s)" % (ctx.node(h).get("ssh_error") or "unreachable"),
                    "the node is down, or its management link or sshd is: doctor could read nothing there",
                    "check its power, management network and sshd (ssh to it by hand); %s" % DOCTOR, host=h)
            for h in sorted(ctx.nodes) if ctx.node(h).get("ssh_unreachable")]


def rule_fabric(ctx: Context) -> list[Problem]:
    """The fabric preflight's checks over the collected fabric: a node whose fabric address no interface carries
    (``fabric_unusable``), a link down (``fabric_link_down``), then ``_fabric.cluster_problems``: MTU mismatch
    between nodes (``fabric_mtu_mismatch``), fabric = management address, duplicate or misplaced addresses."""
    problems = [Problem("fabric_unusable", message.split(": ", 1)[-1].split("; ")[0],
                        "the node has no usable fabric address, so nothing of the cluster can reach it",
                        message.rsplit("; ", 1)[-1], host=host, message=message)
                for host, message in sorted(ctx.fabric_errors.items())]
    for host in sorted(ctx.selections):
        link = link_problem(ctx.selections[host])
        if link is not None:
            problems.append(link)
    if ctx.selections:
        inventory = {h: v for h, v in ctx.hosts.items() if h in ctx.selections}
        heads = [ctx.head] if ctx.head in ctx.selections else []
        found = cluster_problems(ctx.selections, ctx.cluster.get("fabric_cidr"), heads, inventory,
                                 ctx.cluster.get("fabric_expected_mtu"))
        problems.extend(p for p in found if p.rule != "inventory_heads")
    return problems


def _ifname_issue(key: str, value: str, sel: FabricSelection, names: Sequence[str]) -> Optional[str]:
    """Why ``key=value`` does not select exactly the fabric interface (NCCL's ``^``/``=``/prefix rules; Gloo and
    TensorPipe take plain names), or None."""
    fabric, mgmt = sel.interface, sel.mgmt_interface
    text = value.strip()
    exact = key != "NCCL_SOCKET_IFNAME"
    if key == "NCCL_SOCKET_IFNAME" and text.startswith("^"):
        text = text[1:]
        exact_excl = text.startswith("=")
        excluded = [n for n in text.lstrip("=").split(",") if n]
        if any(fabric == n or (not exact_excl and fabric.startswith(n)) for n in excluded):
            return "excludes the fabric interface %s" % fabric
        return None
    if key == "NCCL_SOCKET_IFNAME" and text.startswith("="):
        exact, text = True, text[1:]
    wanted = [n for n in text.split(",") if n]
    for name in wanted:
        matches = [i for i in names if (i == name if exact else i.startswith(name))]
        if fabric not in matches or (not exact and len(matches) > 1 and any(m != fabric for m in matches)):
            if mgmt and (name == mgmt or (not exact and mgmt.startswith(name))):
                return "names %s, the management interface, not the fabric interface %s" % (name, fabric)
            if not matches:
                return "names %s, which does not exist on this node (the fabric interface is %s)" % (name, fabric)
            return "names %s, not the fabric interface %s" % (
                ", ".join(m for m in matches if m != fabric) or name, fabric)
    return None


def rule_env_ifname(ctx: Context) -> list[Problem]:
    """The env file (and the running raylet's environment) names another interface than the fabric in
    NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME or TP_SOCKET_IFNAME (``env_ifname_not_fabric``)."""
    problems = []
    for host in sorted(ctx.selections):
        sel = ctx.selections[host]
        node = ctx.node(host)
        names = [str(i.get("name")) for i in (node.get("network") or {}).get("interfaces") or []] or \
            [n for n in (sel.interface, sel.mgmt_interface) if n]
        raylet = ((node.get("ray_node") or {}).get("env") or {}) if (node.get("ray_node") or {}).get("running") else {}
        for key in IFNAME_KEYS:
            places = (("the env file", node.get("env_file") or {}), ("the running raylet's environment", raylet))
            sources = [(where, str(env[key])) for where, env in places if env.get(key) not in (None, "")]
            for where, value in sources:
                issue = _ifname_issue(key, value, sel, names)
                if issue is None:
                    continue
                problems.append(Problem(
                    "env_ifname_not_fabric", "%s=%s in %s" % (key, value, where),
                    "it %s: %s traffic leaves over the wrong network (the firewall drops it there: a hang, or "
                    "'Gloo connectFullMesh failed')" % (issue, key.split("_", 1)[0]),
                    "render the node environment again (playbooks/deploy.yml writes %s=%s%s) and restart Ray and "
                    "vllm serve" % (key, "=" if key == "NCCL_SOCKET_IFNAME" else "", sel.interface), host=host))
                break
    return problems


def _raylet_env(ctx: Context) -> dict[str, Optional[Mapping[str, Any]]]:
    out: dict[str, Optional[Mapping[str, Any]]] = {}
    for host in ctx.reachable():
        ray_node = ctx.node(host).get("ray_node") or {}
        out[host] = ray_node.get("env") or {} if ray_node.get("running") else None
    return out


def rule_ray(ctx: Context) -> list[Problem]:
    """Ray verify (``_ray_state.evaluate_problems``) over the head's node table and each raylet's environment:
    a node on the management address (``ray_not_on_fabric``, the incident), VLLM_HOST_IP missing, wrong or shared,
    dead or missing nodes, tokens; and the table unreadable while Ray should run (``ray_table_unreadable``)."""
    if ctx.cluster.get("backend", "ray") != "ray" or ctx.head not in ctx.reachable():
        return []
    table = ctx.node(ctx.head).get("ray_table") or {}
    if table.get("error") or table.get("nodes") is None:
        if not (ctx.node(ctx.head).get("ray_node") or {}).get("running"):
            return []  # rule_raylet_stopped names the head
        return [Problem("ray_table_unreadable", "Ray's node table could not be read on the head (%s)"
                        % (table.get("error") or "no answer"),
                        "the head's GCS does not answer (stopped, overloaded, or a token mismatch)",
                        "read the head's Ray log tail in the bundle; restart Ray (playbooks/deploy.yml)",
                        host=ctx.head)]
    try:
        parse_cidr(ctx.cluster.get("fabric_cidr"))
    except FabricError:
        return []  # rule_fabric reports fabric_cidr
    inventory = {h: {"fabric_ip": v.get("fabric_ip"), "mgmt_ip": v.get("mgmt_ip")} for h, v in ctx.hosts.items()}
    raylet_env = {h: e for h, e in _raylet_env(ctx).items() if h in inventory}
    _rows, problems = evaluate_problems(table["nodes"], inventory, ctx.cluster.get("fabric_cidr"),
                                        int(ctx.cluster.get("required_gpus") or 0), raylet_env, ctx.head)
    return problems


def rule_raylet_stopped(ctx: Context) -> list[Problem]:
    """No raylet runs on a reachable node of a Ray cluster (``raylet_stopped``); its Ray log's last line says why
    when it can."""
    if ctx.cluster.get("backend", "ray") != "ray":
        return []
    problems = []
    for host in ctx.reachable():
        ray_node = ctx.node(host).get("ray_node")
        if ray_node is None or ray_node.get("running"):
            continue
        last = meaningful_line((ctx.node(host).get("logs") or {}).get("ray") or [])
        problems.append(Problem(
            "raylet_stopped", "no raylet runs on this node%s" % (
                " (the head: no GCS either)" if host == ctx.head else ""),
            "Ray was stopped or crashed here%s" % ("; its log's last line: %s" % last if last else ""),
            "start Ray again (playbooks/deploy.yml, or restart multinode-ray under the node's runtime); %s" % DOCTOR,
            host=host))
    return problems


def _serve_hosts(ctx: Context) -> list[str]:
    if ctx.cluster.get("backend", "ray") == "native":
        return [h for h in ctx.reachable() if h in ctx.hosts or not ctx.hosts]
    return [ctx.head] if ctx.head in ctx.reachable() else []


def rule_vllm_crashed(ctx: Context) -> list[Problem]:
    """vllm serve should run (``cluster.serve``) but does not, or it runs while its log, which a deploy starts
    afresh, says a start failed (a crash loop: its supervisor restarts it, so a process is there at most moments):
    the cause from every node's vLLM log tail by the readiness failure table (``_serve_failure.likely_cause``, rule
    ``vllm_<cause>``), else ``vllm_crashed``."""
    if not ctx.cluster.get("serve"):
        return []
    hosts = [h for h in _serve_hosts(ctx) if ctx.node(h).get("ray_node") is not None]
    down = [h for h in hosts if not (ctx.node(h).get("ray_node") or {}).get("serve_pid")]
    whole = {h: list((ctx.node(h).get("logs") or {}).get("vllm") or []) for h in ctx.reachable()}
    # Only what was logged since vLLM last served counts: a start that waited, then served, left no failure.
    tails = {h: since_ready(t) for h, t in whole.items()}
    tails = {h: t for h, t in tails.items() if t}
    looping = [h for h in hosts if h not in down and fatal_line(tails.get(h) or [])]
    if not down and not looping:
        return []
    cause = likely_cause(tails, {h: first_exception(t) for h, t in tails.items()})
    where = " and ".join(down)
    symptom = "vllm serve is not running on %s" % where if down else \
        "vllm serve failed on %s and runs again (its supervisor restarts it; %s)" % (
            " and ".join(looping), ", ".join("%d start(s) in %s's log tail" % (serve_starts(whole[h]), h)
                                             for h in looping))
    if cause is not None:
        return [cause_problem(cause, symptom)]
    last = "; ".join("%s: %s" % (h, meaningful_line(t)) for h, t in sorted(whole.items()) if meaningful_line(t))
    return [Problem("vllm_crashed", "vllm serve is not running%s" % (" (last log lines: %s)" % last if last else ""),
                    "it exited or was killed, and its log names no known cause",
                    "read the vLLM log tail in the bundle; start it again with playbooks/serve.yml", host=h)
            for h in down]


def rule_disk_full(ctx: Context) -> list[Problem]:
    """The filesystem of the model directory is (nearly) full (``model_disk_full``): free space below
    ``cluster.disk_min_free_bytes``, by default the smaller of 1 GiB and 2% of the disk."""
    problems = []
    for host in ctx.reachable():
        disk = ctx.node(host).get("disk") or {}
        free, total = disk.get("free_bytes"), disk.get("total_bytes")
        if not isinstance(free, int) or isinstance(free, bool):
            continue
        floor = ctx.cluster.get("disk_min_free_bytes")
        if floor is None:
            floor = min(GIB, int(0.02 * total)) if isinstance(total, int) and total > 0 else GIB
        if free >= int(floor):
            continue
        problems.append(Problem(
            "model_disk_full", "the model directory %s has %s free%s" % (
                disk.get("path") or "?", human_bytes(free), " of %s" % human_bytes(total) if isinstance(total, int) else ""),
            "the disk holding multinode_model_dir is full: staging the model, vLLM's caches and logs fail with "
            "'No space left on device'",
            "free space there (old models, caches) or move multinode_model_dir to a larger disk; then stage the "
            "model again (playbooks/model.yml) and restart vllm serve", host=host))
    return problems


_TABLE = re.compile(r"^\s*table\s+(\S+)\s+(\S+)\s*\{")
_SET = re.compile(r"^\s*set\s+(\S+)\s*\{")
_ELEMENTS = re.compile(r"elements\s*=\s*\{([^}]*)\}?")
_DPORT = re.compile(r"tcp\s+dport\s+(\{[^}]*\}|@\S+|\d+(?:-\d+)?)")
_DADDR = re.compile(r"ip\s+daddr\s+(\d+\.\d+\.\d+\.\d+)")
_VERDICT = re.compile(r"\b(drop|reject)\b")


def _ports(text: str) -> set[int]:
    ports: set[int] = set()
    for item in text.strip("{} ").split(","):
        item = item.strip()
        low, _dash, high = item.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ports.update(range(int(low), int(high or low) + 1) if int(high or low) - int(low) < 70000 else ())
    return ports


def nft_rules(ruleset: str) -> list[dict[str, Any]]:
    """The rules of ``nft list ruleset`` that drop or reject TCP ports: table, ports (named sets resolved), the
    destination address they match (None: any), the rule's text; and the tables seen (``table`` only, no ports)."""
    tables: list[dict[str, Any]] = []
    sets: dict[tuple[str, str], set[int]] = {}
    table = ""
    current_set = None
    pending: list[tuple[str, str, Optional[str], str]] = []
    for raw in ruleset.splitlines():
        line = raw.strip()
        match = _TABLE.match(line)
        if match:
            table = "%s %s" % (match.group(1), match.group(2))
            tables.append({"table": table})
            continue
        match = _SET.match(line)
        if match:
            current_set = match.group(1)
            sets.setdefault((table, current_set), set())
            continue
        if current_set is not None:
            elements = _ELEMENTS.search(line)
            if elements:
                sets[(table, current_set)].update(_ports(elements.group(1)))
            elif sets[(table, current_set)] and re.match(r"^[\d,\s-]+\}?$", line):
                sets[(table, current_set)].update(_ports(line))
            if line.endswith("}") and not line.startswith("elements"):
                current_set = None
            continue
        dport = _DPORT.search(line)
        if dport and _VERDICT.search(line) and "accept" not in line:
            daddr = _DADDR.search(line)
            pending.append((table, dport.group(1), daddr.group(1) if daddr else None, line))
    drops = []
    for table_name, spec, daddr, line in pending:
        ports = sets.get((table_name, spec[1:]), set()) if spec.startswith("@") else _ports(spec)
        drops.append({"table": table_name, "ports": sorted(ports), "daddr": daddr, "rule": line})
    return tables + drops


def _cluster_ports(cluster: Mapping[str, Any]) -> dict[int, str]:
    ports: dict[int, str] = {}
    named = dict(cluster.get("ports") or {})
    low, high = named.pop("min_worker_port", None), named.pop("max_worker_port", None)
    for name, value in sorted(named.items()):
        if isinstance(value, int) and not isinstance(value, bool):
            ports.setdefault(value, name)
    if isinstance(low, int) and isinstance(high, int) and high - low < 70000:
        for port in range(low, high + 1):
            ports.setdefault(port, "Ray worker port")
    return ports


def rule_firewall(ctx: Context) -> list[Problem]:
    """The firewall: a rule that drops or rejects a port Ray or vLLM uses (``firewall_port_dropped``, in any
    table: the collection's or another's), the API port closed on the head's management side
    (``firewall_api_port_closed``), the collection's table not loaded while the firewall is on
    (``firewall_table_absent``)."""
    problems = []
    wanted = _cluster_ports(ctx.cluster)
    api_port = (ctx.cluster.get("ports") or {}).get("vllm_api_port")
    for host in ctx.reachable():
        firewall = ctx.node(host).get("firewall")
        if not firewall or firewall.get("ruleset") is None:
            continue
        entries = nft_rules(str(firewall["ruleset"]))
        tables = [e["table"] for e in entries if "rule" not in e]
        mine = "inet %s" % FIREWALL_TABLE
        own = [ip for ip in ((ctx.hosts.get(host) or {}).get("fabric_ip"), (ctx.hosts.get(host) or {}).get("mgmt_ip"))
               if ip]
        for entry in (e for e in entries if "rule" in e):
            if entry["daddr"] is not None and own and entry["daddr"] not in own:
                continue
            hit = [p for p in entry["ports"] if p in wanted]
            if not hit:
                continue
            shown = ", ".join("%d (%s)" % (p, wanted[p]) for p in hit[:5]) + (
                " and %d more" % (len(hit) - 5) if len(hit) > 5 else "")
            fix = ("run playbooks/deploy.yml to render the collection's table again" if entry["table"] == mine else
                   "remove that rule or table (`nft delete table %s`) or let the fabric through it" % entry["table"])
            problems.append(Problem(
                "firewall_port_dropped", "nft table %s drops TCP port %s%s" % (
                    entry["table"], shown, " to %s" % entry["daddr"] if entry["daddr"] else ""),
                "peers' connections to that port time out: Ray ('Unable to connect to GCS', dead nodes), the "
                "rendezvous or the API hang", "%s; %s" % (fix, DOCTOR), host=host, message=entry["rule"]))
        if ctx.cluster.get("firewall_enabled", True) and mine not in tables:
            problems.append(Problem(
                "firewall_table_absent", "nft table %s is not loaded" % mine,
                "the collection's firewall is off on this node (a reboot without its boot unit, `nft flush "
                "ruleset`): Ray's ports answer on the management network",
                "apply it again: playbooks/deploy.yml (role firewall)", host=host))
        if host == ctx.head and ctx.cluster.get("serve") and isinstance(api_port, int) and mine in tables:
            problems.extend(_api_port_closed(str(firewall["ruleset"]), host, api_port))
    return problems


def _api_port_closed(ruleset: str, host: str, api_port: int) -> list[Problem]:
    """The head's management accept rule of the collection's table (comment "management") lacks the API port."""
    for line in ruleset.splitlines():
        if "accept" in line and "management" in line:
            dport = _DPORT.search(line)
            if dport and api_port not in _ports(dport.group(1)):
                return [Problem(
                    "firewall_api_port_closed", "the head's firewall opens TCP %s on the management network, not the "
                    "API port %d" % (dport.group(1), api_port),
                    "clients on the management network cannot reach vLLM's API (connections time out)",
                    "add %d to firewall_mgmt_allow_tcp (the default has vllm_api_port on the head) and run "
                    "playbooks/deploy.yml" % api_port, host=host, message=line.strip())]
    return []


def rule_stack(ctx: Context) -> list[Problem]:
    """The stack gate (``_stack.stack_problems``) over the nodes whose stack was read (``stack_skew``)."""
    stacks = {h: ctx.node(h).get("stack") for h in ctx.reachable() if ctx.node(h).get("stack")}
    if len(stacks) < 2:
        return []
    try:
        return stack_problems(stacks, ctx.cluster.get("stack_allow_skew") or ())
    except StackError as exc:
        return [Problem("stack_skew", "ray_stack_allow_skew cannot be read", str(exc), "fix ray_stack_allow_skew",
                        message=str(exc))]


def rule_bind(ctx: Context) -> list[Problem]:
    """The bind audit (``_bind_audit``): a cluster process listening off the fabric (``bind_not_fabric``), from the
    collector's judged listeners, or judged here with the default patterns when they carry no verdict."""
    problems = []
    for host in sorted(ctx.selections):
        sel = ctx.selections[host]
        judged = []
        for item in ctx.node(host).get("listeners") or []:
            if "verdict" not in item:
                try:
                    item = dict(item, **classify(item, sel.ip, check_allow(ctx.cluster.get("bind_allow") or []),
                                                 compile_patterns(None), "cluster", sel.mgmt_ip, host))
                except AuditError:
                    continue
            judged.append(item)
        problems.extend(listener_problems(judged, sel.ip, host))
    return problems


def rule_nccl(ctx: Context) -> list[Problem]:
    """The last preflight's NCCL transport (``_nccl_log.transport_problems``): NET/IB on the fabric port's HCAs
    where the fabric has RDMA ports (``nccl_transport``)."""
    problems = []
    for host in sorted(ctx.selections):
        nccl = ctx.node(host).get("nccl")
        sel = ctx.selections[host]
        if not nccl or not sel.hca_ports:
            continue
        for message in transport_problems(host, parse_nccl_log(nccl), "ib", list(sel.hca_ports)):
            body = message.split(": ", 1)[-1]
            problems.append(Problem("nccl_transport", body.split("; ")[0], "NCCL did not use the fabric's RDMA ports "
                                    "as configured", body.split("; ", 1)[-1], host=host, message=message))
    return problems


RULES: tuple[Callable[[Context], list[Problem]], ...] = (
    rule_ssh_unreachable,
    rule_fabric,
    rule_env_ifname,
    rule_ray,
    rule_raylet_stopped,
    rule_vllm_crashed,
    rule_disk_full,
    rule_firewall,
    rule_stack,
    rule_bind,
    rule_nccl,
)


def weight(problem: Problem) -> int:
    """The rule's weight (``WEIGHTS``); a vLLM failure cause not listed there ``VLLM_CAUSE_WEIGHT``."""
    if problem.rule in WEIGHTS:
        return WEIGHTS[problem.rule]
    if problem.rule.startswith("vllm_"):
        return VLLM_CAUSE_WEIGHT if problem.rule != "vllm_engine_failed" else WEIGHTS["vllm_crashed"]
    return DEFAULT_WEIGHT


def diagnose(collected: Mapping[str, Any]) -> list[Problem]:
    """Every rule over the collected facts: the findings, most likely first (``_problems.ordered``)."""
    ctx = context(collected)
    found = [p for rule in RULES for p in rule(ctx)]
    return ordered(p.weighted(weight(p)) for p in found)


def format_findings(findings: Sequence[Problem]) -> list[str]:
    """``host: symptom -> cause -> fix`` lines, in the order given; one line saying so when there is none."""
    return lines(findings) or ["no problem found in what was collected"]


def report(collected: Mapping[str, Any], secrets: Sequence[str] = ()) -> dict[str, Any]:
    """Diagnose, then redact: ``{"findings": [Problem.as_dict], "lines": [...], "bundle": collected}``, every string
    redacted (``_secrets.redact_data``) of ``secrets`` and of every value under a secret-looking key."""
    findings = diagnose(collected)
    out = {"findings": [f.as_dict() for f in findings], "lines": format_findings(findings),
           "bundle": collected}
    redacted = redact_data(out, secrets)
    return dict(redacted) if isinstance(redacted, dict) else {}
