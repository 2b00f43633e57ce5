# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stack fingerprint gate: every node runs the same Python, Ray, vLLM, torch, NCCL, CUDA, driver, image, model.

Each node's stack is the ``multinode_stack`` fact (``stack_facts``, which runs ``_node_versions.stack`` in the
runtime), plus, where the role read them, ``image_id`` (docker) and ``model_manifest`` (the node's model manifest,
reduced here to one digest, the component ``model``). ``stack_errors`` names every component whose value differs
between nodes, unless the allow-list (``ray_stack_allow_skew``) accepts it; ``stack_table`` is the node x
component table printed before.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem, messages

# In the order of the table's columns and of the errors.
COMPONENTS = ("python", "ray", "vllm", "torch", "nccl", "cuda_runtime", "driver", "image_id", "model")
# Shown and compared only when some node reports them (the docker runtime; a staged model).
OPTIONAL = ("image_id", "model")
NOT_INSTALLED = "not installed"
ALLOW_VAR = "ray_stack_allow_skew"

_FIXES = {
    "python": "install the same Python on every node (the runtime's interpreter, or the same image)",
    "ray": "install the same Ray version on every node (or run the same image)",
    "vllm": "install the same vLLM version on every node (or run the same image)",
    "torch": "install the same torch version on every node (or run the same image)",
    "nccl": "install the same NCCL on every node: the same nvidia-nccl wheel in every runtime, or the same "
            "system libnccl (or run the same image)",
    "cuda_runtime": "install the same CUDA runtime wheel (nvidia-cuda-runtime-*) on every node (or run the same image)",
    "driver": "install the same NVIDIA driver version on every node",
    "image_id": "pull or rebuild the same image on every node (one tag can name different images: pin it by digest)",
    "model": "stage the same model on every node (the model role copies the head's model and verifies it)",
}


class StackError(MultinodeError):
    """The stack gate's input (the allow-list, a node's fact) is not what it expects."""


def parse_allow(allow: Any) -> dict[str, str]:
    """``ray_stack_allow_skew`` -> {component: reason}; a StackError names every bad entry and the fix."""
    if allow is None:
        return {}
    if isinstance(allow, (str, bytes)) or not isinstance(allow, Sequence):
        raise StackError("%s = %r: expected a list of component names or of {component: name, reason: text}; "
                         "for example [{component: driver, reason: 'minor driver skew tested'}]" % (ALLOW_VAR, allow))
    out: dict[str, str] = {}
    problems = []
    for index, entry in enumerate(allow):
        if isinstance(entry, Mapping):
            name, reason = entry.get("component"), entry.get("reason")
            extra = sorted(str(k) for k in entry if k not in ("component", "reason"))
            if extra:
                problems.append("%s[%d] = %r: unknown key(s) %s; an entry has only component and reason"
                                % (ALLOW_VAR, index, dict(entry), ", ".join(extra)))
                continue
        else:
            name, reason = entry, None
        if not isinstance(name, str) or name not in COMPONENTS:
            problems.append("%s[%d] = %r: not a stack component; expected one of %s"
                            % (ALLOW_VAR, index, name if isinstance(entry, Mapping) else entry, ", ".join(COMPONENTS)))
            continue
        if reason is not None and not isinstance(reason, str):
            problems.append("%s[%d]: reason = %r: expected text saying why the difference is harmless"
                            % (ALLOW_VAR, index, reason))
            continue
        out[name] = reason or ""
    if problems:
        raise StackError("; ".join(problems))
    return out


def manifest_digest(manifest: Mapping[str, Any] | None) -> str | None:
    """One digest of a model manifest (every file's path, size and sha256): ``sha256:0123456789ab (12 file(s))``."""
    if not manifest:
        return None
    files = sorted((str(f.get("path")), f.get("size"), f.get("sha256")) for f in manifest.get("files") or [])
    if not files:
        return None
    digest = hashlib.sha256(json.dumps(files, separators=(",", ":")).encode()).hexdigest()
    return "sha256:%s (%d file(s))" % (digest[:12], len(files))


def stack_values(stacks: Mapping[str, Mapping[str, Any] | None]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """(the components shown, {host: {component: value}}); a component a node lacks is ``not installed``."""
    raw: dict[str, dict[str, Any]] = {}
    for host, fact in stacks.items():
        fact = dict(fact or {})
        if "model_manifest" in fact:
            fact["model"] = manifest_digest(fact.pop("model_manifest"))
        raw[host] = fact
    shown = [c for c in COMPONENTS
             if c not in OPTIONAL or any(fact.get(c) not in (None, "") for fact in raw.values())]
    values = {host: {c: (str(fact[c]) if fact.get(c) not in (None, "") else NOT_INSTALLED) for c in shown}
              for host, fact in raw.items()}
    return shown, values


def stack_problems(stacks: Mapping[str, Mapping[str, Any] | None], allow: Any = ()) -> list[Problem]:
    """``stack_errors`` as Problems: rule ``stack_skew`` (one per component that differs, not allowed) or
    ``stack_unknown`` (a node without its fact)."""
    allowed = parse_allow(allow)
    missing = sorted(host for host, fact in stacks.items() if not fact)
    if missing:
        message = ("%s: no multinode_stack fact; run multinode.vllm.stack_facts on every host first (the role's "
                   "stack_check.yml does)" % ", ".join(missing))
        return [Problem("stack_unknown", "%s: no multinode_stack fact" % ", ".join(missing),
                        "the stack of those nodes was not read", "run multinode.vllm.stack_facts on every host first",
                        message=message)]
    shown, values = stack_values(stacks)
    problems = []
    for component in shown:
        if component in allowed:
            continue
        groups: dict[str, list[str]] = {}
        for host in stacks:
            groups.setdefault(values[host][component], []).append(host)
        if len(groups) < 2:
            continue
        found = "; ".join("%s: %s" % (", ".join(hosts), value) for value, hosts in groups.items())
        fix = "%s, or, if the difference is known to be harmless, add {component: %s, reason: <why>} to %s" % (
            _FIXES[component], component, ALLOW_VAR)
        problems.append(Problem(
            "stack_skew", "%s differs between nodes (%s)" % (component, found),
            "the nodes run different %s: Ray refuses a version mismatch, NCCL or torch differences hang or fail the "
            "first collective" % component, _FIXES[component],
            message="%s differs between nodes (%s); %s" % (component, found, fix)))
    return problems


def stack_errors(stacks: Mapping[str, Mapping[str, Any] | None], allow: Any = ()) -> list[str]:
    """One message per component whose value differs between nodes (not allowed), hosts grouped by value."""
    return messages(stack_problems(stacks, allow))


def stack_table(stacks: Mapping[str, Mapping[str, Any] | None], hosts: Sequence[str]) -> list[list[str]]:
    """Rows for display: a header (``node`` and the components shown), then one row per host in ``hosts``."""
    shown, values = stack_values({h: stacks.get(h) for h in hosts})
    return [["node", *shown]] + [[host, *(values[host][c] for c in shown)] for host in hosts]


def table_lines(rows: Sequence[Sequence[str]]) -> list[str]:
    """The rows as aligned text lines (a debug message)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
