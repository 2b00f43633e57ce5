# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Doctor's collection and bundle: a node's parts read in isolation, the cluster's ``collected`` facts assembled
from every host's result (an SSH-unreachable host included), and the tarball's layout.

The node side (``doctor_collect``) reads each part with ``run_parts``: a part that raises records its error under
``errors`` and the others still run, so a node where Ray is absent, nft is missing or the runtime's interpreter
does not start still reports everything else. The controller side (``doctor_report``) turns every host's
registered result into ``_diagnosis``'s ``collected`` (``collected``), diagnoses and redacts it
(``_diagnosis.report``), and lays out the bundle (``bundle_files``):

    doctor-<cluster>-<UTC timestamp>/
      diagnosis.txt            the findings (symptom -> cause -> fix, most likely first), what could not be read,
                               one summary line per node
      diagnosis.json           the findings as data, the lines, the errors
      cluster.json             the cluster part of collected
      nodes/<host>.json        each node's part of collected (redacted)
      logs/<host>/<kind>.log   the raw log tails (ray, vllm) and the preflight's NCCL lines, one file each

Everything written is taken from the redacted report: no file holds a value the redaction did not see.

Pure but for ``write_bundle`` (the tarball itself): no Ansible imports.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._diagnosis import report as diagnosis_report
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import MIN_HARVESTED

# The env file's keys that say which network and transport each library takes (the spec's "NCCL/Gloo/UCX keys"),
# and the rendezvous address; never a secret.
ENV_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "TP_SOCKET_", "TORCH_NCCL_", "MASTER_")
ENV_KEYS = ("VLLM_HOST_IP",)
# Processes kept per node (a busy node has thousands; the cluster's are among the first found by pid order).
MAX_PROCESSES = 400
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

Part = Callable[[], Mapping[str, Any]]


class DoctorError(MultinodeError):
    """Doctor's input (the bundle directory, the cluster's name) cannot be used; the message names it and the fix."""


def fabric_env(env: Mapping[str, Any]) -> dict[str, str]:
    """The keys of an env file that choose the network and transport (NCCL_*, GLOO_*, UCX_*, TP_SOCKET_IFNAME,
    MASTER_*, VLLM_HOST_IP), sorted; every other key (a secret among them) is left out."""
    return {str(k): str(v) for k, v in sorted(env.items())
            if str(k) in ENV_KEYS or any(str(k).startswith(p) for p in ENV_PREFIXES)}


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if type(exc).__name__ in text else "%s: %s" % (type(exc).__name__, text)


def run_parts(parts: Sequence[tuple[str, Part]], workers: int = 1) -> tuple[dict[str, Any], dict[str, str]]:
    """Run every part (a name and a function returning node keys), ``workers`` at a time; merge what each returned,
    in the order given. A part that raises, or returns anything but a mapping, records ``{name: why}`` in the
    errors and adds nothing: the other parts still run. Returns (node keys, errors)."""

    def one(part: tuple[str, Part]) -> tuple[Optional[Mapping[str, Any]], Optional[str]]:
        try:
            got = part[1]()
        except Exception as exc:  # pylint: disable=broad-except  # a broken part must not hide the others
            return None, _error_text(exc)
        if not isinstance(got, Mapping):
            return None, "returned %s, not a mapping" % type(got).__name__
        return got, None

    if workers > 1 and len(parts) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(parts))) as pool:
            outcomes = list(pool.map(one, parts))
    else:
        outcomes = [one(part) for part in parts]
    node: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for (name, _read), (got, error) in zip(parts, outcomes):
        if error is not None:
            errors[name] = error
        elif got is not None:
            node.update(got)
    return node, errors


def secret_file_values(text: str) -> list[str]:
    """The secrets a secret file holds: every value of its ``KEY=value`` lines (an env file, written for the
    launcher or for sh, quotes stripped), or the whole text when it has none (a token file). Values shorter than
    ``_secrets.MIN_HARVESTED`` are left out (``1``, ``true``), as harvested ones are."""
    values = []
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and re.match(r"^(export\s+)?[A-Za-z_][A-Za-z0-9_]*$", key.strip()):
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values.append(value)
    if not values and text.strip():
        values = [text.strip()]
    return [v for v in values if len(v) >= MIN_HARVESTED]


def secret_values(*sources: Any) -> list[str]:
    """Every string in ``sources`` (strings, lists, the values of dicts, nested), long enough to redact: the
    inventory's secrets (vllm_api_key, the values of vllm_secret_env, a token)."""
    found: set[str] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, Mapping):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple, set)):
            for item in obj:
                walk(item)
        elif isinstance(obj, (str, int)) and not isinstance(obj, bool):
            text = str(obj).strip()
            if len(text) >= MIN_HARVESTED:
                found.add(text)

    for source in sources:
        walk(source)
    return sorted(found)


def node_from_result(result: Any) -> dict[str, Any]:
    """One host's part of ``collected`` from what its ``doctor_collect`` task registered: the module's ``node``;
    for a host SSH could not reach ``ssh_unreachable`` with Ansible's message; for a module that did not run
    (no Python, a crash) the reason under ``errors.collect``."""
    if not isinstance(result, Mapping) or not result:
        return {"ssh_unreachable": False, "errors": {"collect": "no result: the host was not in the play"}}
    if result.get("unreachable"):
        # Ansible 2.19 words it "Task failed: Failed to connect to the host via ssh: ...".
        why = re.sub(r"^Task failed:\s*", "", str(result.get("msg") or "unreachable").strip())
        return {"ssh_unreachable": True, "ssh_error": why}
    node = result.get("node")
    if result.get("failed") or not isinstance(node, Mapping):
        detail = str(result.get("msg") or "").strip()
        stderr = str(result.get("module_stderr") or "").strip()
        if stderr:
            detail = "%s: %s" % (detail or "module failure", stderr.splitlines()[-1])
        if result.get("skipped"):
            detail = "skipped (%s)" % (result.get("skip_reason") or "a condition")
        return {"ssh_unreachable": False, "errors": {"collect": detail or "the collector returned no node"}}
    out = dict(node)
    out["ssh_unreachable"] = False
    return out


def _whole(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def cluster_part(cluster: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The cluster part as ``_diagnosis`` reads it: numbers as ints (Jinja gives strings), an unset optional value
    left out, and each host's fabric and management address completed from what its node found (the inventory's
    ``ansible_host`` may be a name, and a fabric address may come from the fabric alone)."""
    out = {k: v for k, v in cluster.items() if v not in (None, "")}
    for key in ("fabric_expected_mtu", "required_gpus", "disk_min_free_bytes"):
        if key in out:
            number = _whole(out[key])
            if number is None:
                del out[key]
            else:
                out[key] = number
    for key in ("serve", "firewall_enabled"):
        if isinstance(out.get(key), str):
            out[key] = out[key].strip().lower() in ("true", "yes", "on", "1")
    ports = {}
    for key, value in dict(out.get("ports") or {}).items():
        number = _whole(value)
        if number is not None:
            ports[str(key)] = number
    out["ports"] = ports
    hosts = {}
    for host, values in dict(out.get("hosts") or {}).items():
        entry = {k: v for k, v in dict(values or {}).items() if v not in (None, "")}
        fabric = (nodes.get(host) or {}).get("fabric") or {}
        if fabric.get("mgmt_ip"):
            entry["mgmt_ip"] = fabric["mgmt_ip"]
        if not entry.get("fabric_ip") and fabric.get("ip"):
            entry["fabric_ip"] = fabric["ip"]
        hosts[str(host)] = entry
    out["hosts"] = hosts
    return out


def collected(cluster: Mapping[str, Any], results: Mapping[str, Any]) -> dict[str, Any]:
    """``_diagnosis``'s input: each host's node from its registered result, and the cluster part completed from
    them (``cluster_part``)."""
    nodes = {str(h): node_from_result(r) for h, r in sorted(results.items())}
    return {"cluster": cluster_part(cluster, nodes), "nodes": nodes}


def collection_errors(data: Mapping[str, Any]) -> list[str]:
    """``host: part: why`` for every part a node could not read (SSH-unreachable nodes are findings, not here)."""
    out = []
    for host, node in sorted((data.get("nodes") or {}).items()):
        for part, why in sorted((node.get("errors") or {}).items()):
            out.append("%s: %s: %s" % (host, part, why))
    return out


def safe_name(text: str) -> str:
    """A name usable as one path component (``spark1``, ``gpu-head.example``): other characters become ``_``."""
    name = _UNSAFE.sub("_", str(text)).strip("._") or "_"
    return name[:100]


def bundle_name(cluster_name: str, when: datetime) -> str:
    """``doctor-<cluster>-<UTC timestamp>``, for example ``doctor-spark1-20260105T101500Z``."""
    if not str(cluster_name).strip():
        raise DoctorError("doctor_cluster_name is empty; set it to the cluster's name (default: the head's name)")
    return "doctor-%s-%s" % (safe_name(cluster_name), when.strftime("%Y%m%dT%H%M%SZ"))


def _value(node: Mapping[str, Any], *path: str) -> Any:
    current: Any = node
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


def node_summary(host: str, node: Mapping[str, Any]) -> str:
    """One line per node for diagnosis.txt: versions, kernel, the fabric link, Ray and vllm serve."""
    if node.get("ssh_unreachable"):
        return "%s: not reached over SSH (%s)" % (host, node.get("ssh_error") or "unreachable")
    stack = node.get("stack") or {}
    versions = " ".join("%s %s" % (k, stack[k]) for k in ("python", "ray", "vllm", "torch") if stack.get(k)) \
        or "stack not read"
    fabric = node.get("fabric") or {}
    link = "fabric %s %s mtu %s%s" % (fabric.get("interface"), fabric.get("ip"), fabric.get("mtu"),
                                      " (%s)" % fabric["link_error"] if fabric.get("link_error") else "") \
        if fabric.get("interface") else "fabric not found"
    ray = node.get("ray_node")
    if ray is None:
        ray_text = "Ray not read"
    elif ray.get("running"):
        ray_text = "raylet pid %s on %s" % (ray.get("raylet_pid"), ray.get("node_ip_address"))
    else:
        ray_text = "no raylet"
    serve = "vllm serve pid %s" % ray["serve_pid"] if ray and ray.get("serve_pid") else "no vllm serve"
    kernel = _value(node, "system", "kernel") or "kernel ?"
    return "%s: %s; %s; %s; %s; %s" % (host, versions, kernel, link, ray_text, serve)


def diagnosis_text(report: Mapping[str, Any], title: str) -> str:
    """diagnosis.txt: the findings, most likely first, numbered; what could not be read; a line per node."""
    bundle = report.get("bundle") or {}
    out = [title, "", "Findings (symptom -> cause -> fix), most likely first:"]
    out += ["%2d. %s" % (i, line) for i, line in enumerate(report.get("lines") or [], 1)]
    errors = collection_errors(bundle)
    out += ["", "What could not be read:"] + (["  " + e for e in errors] if errors else ["  nothing"])
    out += ["", "Nodes:"] + ["  " + node_summary(h, n) for h, n in sorted((bundle.get("nodes") or {}).items())]
    return "\n".join(out) + "\n"


def _lines_text(lines: Any) -> str:
    if not isinstance(lines, (list, tuple)):
        return ""
    return "".join("%s\n" % line for line in lines)


def bundle_files(report: Mapping[str, Any], name: str, title: str = "") -> dict[str, str]:
    """The bundle's files, path (under ``name/``) -> text, all from the redacted ``report``
    (``_diagnosis.report``'s findings, lines and bundle)."""
    bundle = report.get("bundle") or {}
    nodes = bundle.get("nodes") or {}
    files = {
        "%s/diagnosis.txt" % name: diagnosis_text(report, title or name),
        "%s/diagnosis.json" % name: json.dumps({"findings": report.get("findings") or [],
                                                "lines": report.get("lines") or [],
                                                "errors": collection_errors(bundle)}, indent=2, sort_keys=True),
        "%s/cluster.json" % name: json.dumps(bundle.get("cluster") or {}, indent=2, sort_keys=True, default=str),
    }
    for host, node in sorted(nodes.items()):
        files["%s/nodes/%s.json" % (name, safe_name(host))] = json.dumps(node, indent=2, sort_keys=True, default=str)
        logs = dict(node.get("logs") or {})
        if node.get("nccl"):
            logs["nccl"] = node["nccl"]
        for kind, lines in sorted(logs.items()):
            files["%s/logs/%s/%s.log" % (name, safe_name(host), safe_name(kind))] = _lines_text(lines)
    return files


def build(cluster: Mapping[str, Any], results: Mapping[str, Any], secrets: Sequence[str], cluster_name: str,
          when: datetime) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(bundle name, redacted report, files): assemble ``collected``, diagnose, redact, lay out."""
    name = bundle_name(cluster_name, when)
    data = collected(cluster, results)
    report = diagnosis_report(data, secrets)
    report["errors"] = collection_errors(report.get("bundle") or {})
    title = "doctor: cluster %s, %d nodes, collected %s" % (
        cluster_name, len(data["nodes"]), when.strftime("%Y-%m-%d %H:%M:%S UTC"))
    return name, report, bundle_files(report, name, title)


def write_bundle(directory: str, name: str, files: Mapping[str, str], mtime: Optional[float] = None) -> str:
    """Write ``files`` as ``<directory>/<name>.tar.gz`` (mode 0600; the directory made 0700 when missing) and
    return its path. I/O."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise DoctorError("doctor_dir %s cannot be created (%s); set doctor_dir to a writable directory on the "
                          "controller" % (directory, exc.strerror or exc))
    path = os.path.join(directory, name + ".tar.gz")
    stamp = time.time() if mtime is None else mtime
    try:
        handle = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
    except OSError as exc:
        raise DoctorError("%s cannot be written (%s); set doctor_dir to a writable directory on the controller"
                          % (path, exc.strerror or exc))
    with handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
        for member in sorted(files):
            data = files[member].encode("utf-8", "replace")
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o600, int(stamp)
            tar.addfile(info, io.BytesIO(data))
    return path
