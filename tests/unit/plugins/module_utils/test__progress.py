# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Progress lines: sizes, durations, rate and ETA from the node's samples, and the controller's watch loop."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._progress import (
    MISSED_POLLS,
    ProgressError,
    RateMeter,
    check_sample,
    format_bytes,
    format_duration,
    format_pair,
    format_rate,
    progress_line,
    run_watched,
    summary_line,
    watch,
)

GIB = 1024 ** 3


@pytest.mark.parametrize("value, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (4 * 1024 ** 2 + 27, "4.0 MiB"),
    (int(119.0 * GIB), "119.0 GiB"), (3 * 1024 ** 4, "3.0 TiB"), (2 * 1024 ** 6, "2048.0 PiB"),
])
def test_format_bytes(value, text):
    assert format_bytes(value) == text


@pytest.mark.parametrize("done, total, text", [
    (37.2 * GIB, 119.0 * GIB, "37.2/119.0 GiB"), (0, 119.0 * GIB, "0.0/119.0 GiB"), (0, 0, "0/0 B"),
    (512, 1000, "512/1000 B"), (300 * 1024, 2 * 1024 ** 2, "0.3/2.0 MiB"),
])
def test_format_pair_uses_the_unit_of_the_total(done, total, text):
    assert format_pair(done, total) == text


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (0.2, "1 s"), (43, "43 s"), (59.5, "1 min 0 s"), (60, "1 min 0 s"), (725, "12 min 5 s"),
    (3599, "59 min 59 s"), (3600, "1 h 00 min"), (7380, "2 h 03 min"), (-5, "0 s"),
])
def test_format_duration_rounds_up(seconds, text):
    assert format_duration(seconds) == text


def test_format_rate():
    assert format_rate(1.9 * GIB) == "1.9 GiB/s"


def _sample(t, done, total=119 * GIB, files=(12, 41)):
    return {"t": t, "bytes_done": done, "bytes_total": total, "files_done": files[0], "files_total": files[1]}


def test_rate_and_eta_over_the_window_of_the_node_clock():
    meter = RateMeter(window=20)
    meter.add(_sample(100.0, 10 * GIB))
    assert meter.rate() is None and meter.eta() is None
    meter.add(_sample(105.0, 20 * GIB))
    assert meter.rate() == pytest.approx(2 * GIB) and meter.eta() is None  # no ETA from two samples
    meter.add(_sample(110.0, 30 * GIB))
    assert meter.rate() == pytest.approx(2 * GIB)
    assert meter.eta() == pytest.approx((119 - 30) / 2)
    # Samples older than the window drop out: the rate follows a slowdown.
    for t in range(115, 140, 5):
        meter.add(_sample(float(t), 30 * GIB + (t - 110) * GIB / 10))
    assert meter.rate() == pytest.approx(GIB / 10)
    assert meter.samples[0][0] >= 135 - 20 - 5


def test_a_sample_that_is_not_newer_is_ignored_and_bytes_going_back_restart_the_window():
    meter = RateMeter()
    meter.add(_sample(100.0, 10 * GIB))
    meter.add(_sample(101.0, 11 * GIB))
    meter.add(_sample(101.0, 50 * GIB))  # the same node time twice: not a new measurement
    assert meter.last["bytes_done"] == 11 * GIB
    meter.add(_sample(102.0, 5 * GIB))  # a file started again from byte 0
    assert meter.rate() is None and len(meter.samples) == 1


def test_a_stall_is_shown_instead_of_an_averaged_rate():
    meter = RateMeter(window=10)
    meter.add(_sample(0.0, GIB))
    meter.add(_sample(5.0, 2 * GIB))
    meter.add(_sample(10.0, 2 * GIB))
    assert progress_line("spark2", "model pull", meter).endswith("12/41 files, 102.4 MiB/s, ETA 19 min 30 s")
    meter.add(_sample(16.0, 2 * GIB))
    assert progress_line("spark2", "model pull", meter).endswith("12/41 files, no progress for 11 s")


def test_the_line_of_the_issue():
    meter = RateMeter()
    meter.add(_sample(0.0, 37.2 * GIB - 19 * GIB))
    meter.add(_sample(5.0, 37.2 * GIB - 9.5 * GIB))
    meter.add(_sample(10.0, 37.2 * GIB))
    assert progress_line("spark2", "model pull", meter) == \
        "spark2: model pull 37.2/119.0 GiB, 12/41 files, 1.9 GiB/s, ETA 44 s"


def test_before_a_rate_and_before_the_totals():
    meter = RateMeter()
    assert progress_line("spark1", "model download", meter) == "spark1: model download starting"
    meter.add({"t": 1.0, "phase": "asking the Hub for the files of org/tiny"})
    assert progress_line("spark1", "model download", meter) == \
        "spark1: model download asking the Hub for the files of org/tiny"
    meter.add(_sample(2.0, 0, 4 * 1024 ** 2, (0, 3)))
    assert progress_line("spark1", "model download", meter) == \
        "spark1: model download 0.0/4.0 MiB, 0/3 files, rate -, ETA -"


@pytest.mark.parametrize("sample, field", [
    ({"bytes_done": 1}, "t"), ({"t": 1, "bytes_done": -1}, "bytes_done"), ({"t": True}, "t"),
    ({"t": 1, "files_total": "41"}, "files_total"),
])
def test_a_bad_sample_names_the_field(sample, field):
    with pytest.raises(ProgressError, match="progress sample: %s must be a number" % field):
        check_sample(sample)


def test_summary_line():
    assert summary_line("spark2", "model pull", 119 * GIB, 41, 62, "from 198.18.200.12:29510") == \
        "spark2: model pull done: 119.0 GiB in 41 files, 1 min 2 s, mean 1.9 GiB/s; from 198.18.200.12:29510"
    assert summary_line("spark2", "model pull", 10, 1, 0) == "spark2: model pull done: 10 B in 1 file, 0 s, mean -"


class Clock:
    """The controller's clock and sleep, stood in: sleeping moves the clock."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def _statuses(*items):
    items = list(items)
    return lambda: items.pop(0)


def test_watch_polls_every_interval_and_says_a_line_per_running_status():
    clock, said = Clock(), []
    poll = _statuses({"job_state": "running", "progress": _sample(0.0, 0)},
                     {"job_state": "running", "progress": _sample(5.0, 10 * GIB)},
                     {"job_state": "done", "changed": True, "bytes": 119 * GIB})
    final = watch(poll, said.append, "spark2", "model pull", 5.0, clock=clock, sleep=clock.sleep)
    assert final == {"job_state": "done", "changed": True, "bytes": 119 * GIB}
    assert clock.sleeps == [5.0, 5.0, 5.0]
    assert said == ["spark2: model pull 0.0/119.0 GiB, 12/41 files, rate -, ETA -",
                    "spark2: model pull 10.0/119.0 GiB, 12/41 files, 2.0 GiB/s, ETA -"]


def test_watch_keeps_the_interval_when_a_status_run_is_slow():
    clock = Clock()

    def poll():
        clock.now += 2.0  # an SSH round trip and a module run
        return {"job_state": "done"} if clock.now > 1010 else {"job_state": "running", "progress": _sample(clock.now, 0)}

    watch(poll, lambda line: None, "spark2", "model pull", 5.0, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [5.0, 3.0]


def test_watch_retries_a_poll_that_did_not_reach_the_node_then_gives_up_naming_the_host():
    clock = Clock()
    lost = {"failed": True, "msg": "Failed to connect to the host via ssh"}
    final = watch(_statuses(*[lost] * MISSED_POLLS), lambda line: None, "spark2", "model pull", 1.0,
                  clock=clock, sleep=clock.sleep)
    assert final["failed"] and final["msg"].startswith("spark2: lost track of the model pull after 3 status runs")
    assert "Failed to connect" in final["msg"] and "may still run on spark2" in final["msg"]
    # One miss between answers is forgiven.
    final = watch(_statuses(lost, {"job_state": "running", "progress": _sample(1.0, 0)}, lost, {"job_state": "done"}),
                  lambda line: None, "spark2", "model pull", 1.0, clock=clock, sleep=clock.sleep)
    assert final == {"job_state": "done"}


def test_run_watched_returns_a_start_that_failed_or_had_nothing_to_do_without_watching():
    runs = []

    def module(job):
        runs.append(job)
        return {"changed": False, "received": [], "bytes": 0}

    assert run_watched(module, lambda line: None, "spark2", "model pull", 1.0, lambda r: "x") == \
        {"changed": False, "received": [], "bytes": 0}
    assert runs == ["start"]


def test_run_watched_says_the_summary_of_the_final_result_and_drops_state():
    clock, said = Clock(), []
    answers = {"start": [{"job_state": "started", "pid": 42, "adopted": True}],
               "status": [{"job_state": "running", "progress": _sample(0.0, 0)}, {"job_state": "done", "bytes": 7}]}
    final = run_watched(lambda job: answers[job].pop(0), said.append, "spark1", "model download", 1.0,
                        lambda result: "summary of %d bytes" % result["bytes"], clock=clock, sleep=clock.sleep)
    assert final == {"bytes": 7}
    assert said[0] == "spark1: a model download started before (pid 42) is still running: watching it"
    assert said[-1] == "summary of 7 bytes"
    answers = {"start": {"job_state": "started"}, "status": {"job_state": "done", "failed": True, "msg": "m"}}
    failed = run_watched(lambda job: answers[job],
                         said.append, "spark1", "model download", 1.0, lambda result: "never",
                         clock=clock, sleep=clock.sleep)
    assert failed == {"failed": True, "msg": "m"} and "never" not in said
