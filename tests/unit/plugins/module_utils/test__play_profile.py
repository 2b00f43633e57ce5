# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The per-task profile of a playbook run from ansible-runner job events. The events are written here in the shape
ansible-runner 2.4.3's display callback gives them (awx_display.py: event, event_data with task_uuid, task, role,
host, start, end as ISO times); a lab run through tests/bench/profile_deploy.py reads real ones."""

from __future__ import annotations

from ansible_collections.multinode.vllm.plugins.module_utils._play_profile import markdown, profile

T0 = "2026-12-06T12:00:%06.3f"


def event(kind, uuid, task, role, host, start, end):
    return {"event": kind, "event_data": {"task_uuid": uuid, "task": task, "role": role, "host": host,
                                          "start": T0 % start, "end": T0 % end}}


EVENTS = [
    {"event": "playbook_on_start", "event_data": {}},
    event("runner_on_ok", "a", "Read fabric facts", "fabric", "spark1", 1.0, 2.0),
    event("runner_on_ok", "a", "Read fabric facts", "fabric", "spark2", 1.1, 3.0),
    # A loop: two items on one host add up.
    event("runner_on_ok", "b", "Probe pairs", "fabric", "spark1", 3.5, 4.0),
    event("runner_on_ok", "b", "Probe pairs", "fabric", "spark1", 4.0, 5.5),
    event("runner_on_skipped", "c", "Stop foreign Ray", "ray", "spark1", 6.0, 6.1),
    event("runner_on_skipped", "c", "Stop foreign Ray", "ray", "spark2", 6.0, 6.2),
    event("runner_on_failed", "d", "Start Ray | head", "ray", "spark1", 7.0, 10.0),
    # An event without timing (a no-hosts or a stats event) is left out, not counted as zero.
    {"event": "runner_on_ok", "event_data": {"task_uuid": "e", "task": "x", "host": "spark1"}},
]


def test_task_wall_is_first_start_to_last_end_and_loops_add_up_per_host():
    result = profile(EVENTS)
    rows = {row["task"]: row for row in result["tasks"]}
    assert [row["task"] for row in result["tasks"]] == ["Read fabric facts", "Probe pairs", "Stop foreign Ray",
                                                        "Start Ray | head"]
    assert abs(rows["Read fabric facts"]["wall"] - 2.0) < 1e-9
    assert rows["Read fabric facts"]["slowest"] == "spark2"
    assert abs(rows["Read fabric facts"]["slowest_s"] - 1.9) < 1e-9
    assert abs(rows["Probe pairs"]["slowest_s"] - 2.0) < 1e-9 and rows["Probe pairs"]["hosts"] == 1
    assert rows["Stop foreign Ray"]["skipped_only"] and not rows["Start Ray | head"]["skipped_only"]


def test_play_time_splits_into_tasks_and_between_them():
    result = profile(EVENTS)
    assert abs(result["wall"] - 9.0) < 1e-9
    # tasks cover 1-3, 3.5-5.5, 6-6.2, 7-10: 2 + 2 + 0.2 + 3
    assert abs(result["in_tasks"] - 7.2) < 1e-9
    assert abs(result["between"] - 1.8) < 1e-9
    assert abs(result["roles"]["fabric"] - 4.0) < 1e-9 and abs(result["roles"]["ray"] - 3.2) < 1e-9


def test_overlapping_tasks_are_not_counted_twice():
    events = [event("runner_on_ok", "a", "A", "", "h1", 0.0, 4.0),
              event("runner_on_ok", "b", "B", "", "h2", 1.0, 3.0)]
    result = profile(events)
    assert abs(result["in_tasks"] - 4.0) < 1e-9 and abs(result["between"]) < 1e-9


def test_no_result_events_give_an_empty_profile():
    assert profile([{"event": "playbook_on_start"}]) == {"tasks": [], "roles": {}, "plays": [], "wall": 0.0,
                                                         "in_tasks": 0.0,
                                                         "between": 0.0}


def test_markdown_lists_slowest_first_and_escapes_table_bars():
    text = markdown(profile(EVENTS), top=2)
    assert text.startswith("Play 9.0 s: 7.2 s in tasks, 1.8 s between them (controller); 4 tasks.")
    body = [line for line in text.splitlines() if line.startswith("| ") and "wall s |" not in line]
    assert body[0].startswith("| Start Ray / head | ray | 3.00 | 1 | spark1 (3.00) |")
    assert body[1].startswith("| Read fabric facts | fabric | 2.00 | 2 | spark2 (1.90) |")
    assert "| Probe pairs |" not in text  # top=2
    assert "| fabric | 4.00 | 2 |" in text and "| ray | 3.20 | 2 |" in text


def test_plays_are_timed_first_task_start_to_last_task_end_in_play_order():
    def in_play(item, play, uuid):
        item = dict(item, event_data=dict(item["event_data"], play=play, play_uuid=uuid))
        return item
    events = [in_play(e, "Fabric preflight", "p1") for e in EVENTS[1:4]] + \
        [in_play(e, "Start the Ray head", "p2") for e in EVENTS[5:8]]
    assert profile(events)["plays"] == [
        {"play": "Fabric preflight", "wall": 3.0, "tasks": 2},
        {"play": "Start the Ray head", "wall": 4.0, "tasks": 2},
    ]
