# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a playbook run's time goes, from ansible-runner's job events (controller side, standard library only).

ansible-runner's display callback (``ansible_runner/display_callback/callback/awx_display.py``, 2.4.3) gives every
``runner_on_ok`` / ``_failed`` / ``_skipped`` / ``_unreachable`` event the host's ``start`` (when that host began
the task), ``end`` and ``duration``, with the task's ``task_uuid``, ``task`` name and ``role``. From those:

- a task's wall time is its first host's start to its last host's end (hosts run a task in parallel, up to forks);
- what lies between tasks (the strategy's bookkeeping, templating, includes, a play's start) is the controller's
  time, reported as one figure (``between``) so a profile shows whether SSH work or the controller dominates;
- per role, the sum of its tasks' wall times; per task, its slowest host;
- per play (each gate of deploy.yml is a play), its first task's start to its last task's end.

``tests/bench/profile_deploy.py`` runs a playbook through ``ansible_runner.run`` and prints ``markdown(profile(...))``.
"""

from __future__ import annotations

import datetime

RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


def _time(value):
    return datetime.datetime.fromisoformat(value) if value else None


def profile(events) -> dict:
    """Tasks in the order they started, each with its wall time, host count and slowest host; per-role totals; the
    play's wall time (first task start to last task end) and the time between tasks."""
    tasks = {}
    for event in events:
        if event.get("event") not in RESULT_EVENTS:
            continue
        data = event.get("event_data") or {}
        start, end = _time(data.get("start")), _time(data.get("end"))
        if start is None or end is None:
            continue
        key = data.get("task_uuid") or (data.get("role"), data.get("task"))
        task = tasks.setdefault(key, {"task": data.get("task") or "?", "role": data.get("role") or "",
                                      "play": data.get("play") or "", "play_uuid": data.get("play_uuid") or "",
                                      "start": start, "end": end, "hosts": {}, "skipped": 0})
        task["start"], task["end"] = min(task["start"], start), max(task["end"], end)
        host = data.get("host") or "?"
        # A loop reports each item; the host's time on the task is the sum of its items.
        task["hosts"][host] = task["hosts"].get(host, 0.0) + (end - start).total_seconds()
        task["skipped"] += event["event"] == "runner_on_skipped"
    ordered = sorted(tasks.values(), key=lambda t: t["start"])
    rows, roles = [], {}
    for task in ordered:
        wall = (task["end"] - task["start"]).total_seconds()
        slowest = max(task["hosts"], key=task["hosts"].get)
        rows.append({"task": task["task"], "role": task["role"], "wall": wall, "hosts": len(task["hosts"]),
                     "slowest": slowest, "slowest_s": task["hosts"][slowest],
                     "skipped_only": task["skipped"] >= len(task["hosts"])})
        roles[task["role"]] = roles.get(task["role"], 0.0) + wall
    if not ordered:
        return {"tasks": [], "roles": {}, "plays": [], "wall": 0.0, "in_tasks": 0.0, "between": 0.0}
    # Per play (a gate of deploy.yml is a play): its first task's start to its last task's end, in play order.
    plays = {}
    for task in ordered:
        first = {"play": task["play"], "start": task["start"], "end": task["end"], "tasks": 0}
        entry = plays.setdefault(task["play_uuid"] or task["play"], first)
        entry["start"], entry["end"] = min(entry["start"], task["start"]), max(entry["end"], task["end"])
        entry["tasks"] += 1
    play_rows = [{"play": e["play"], "wall": (e["end"] - e["start"]).total_seconds(), "tasks": e["tasks"]}
                 for e in sorted(plays.values(), key=lambda e: e["start"])]
    wall = (max(t["end"] for t in ordered) - ordered[0]["start"]).total_seconds()
    # Tasks of different plays can overlap only through async/free strategies; the union keeps the sum honest.
    in_tasks, reach = 0.0, ordered[0]["start"]
    for task in ordered:
        start = max(task["start"], reach)
        if task["end"] > start:
            in_tasks += (task["end"] - start).total_seconds()
            reach = task["end"]
    return {"tasks": rows, "roles": roles, "plays": play_rows, "wall": wall, "in_tasks": in_tasks,
            "between": wall - in_tasks}


def markdown(result: dict, top: int = 15) -> str:
    """The profile as markdown: totals, the slowest tasks by wall time, and per-role sums."""
    lines = ["Play %.1f s: %.1f s in tasks, %.1f s between them (controller); %d tasks."
             % (result["wall"], result["in_tasks"], result["between"], len(result["tasks"])), "",
             "| task | role | wall s | hosts | slowest host (s) |", "|---|---|---|---|---|"]
    for row in sorted(result["tasks"], key=lambda r: -r["wall"])[:top]:
        lines.append("| %s | %s | %.2f | %d | %s (%.2f) |" % (row["task"].replace("|", "/"), row["role"] or "-",
                                                              row["wall"], row["hosts"], row["slowest"],
                                                              row["slowest_s"]))
    lines += ["", "| role | wall s (sum of its tasks) | tasks |", "|---|---|---|"]
    counts = {}
    for row in result["tasks"]:
        counts[row["role"]] = counts.get(row["role"], 0) + 1
    for role, seconds in sorted(result["roles"].items(), key=lambda item: -item[1]):
        lines.append("| %s | %.2f | %d |" % (role or "(play)", seconds, counts[role]))
    return "\n".join(lines) + "\n"
