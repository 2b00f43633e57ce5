# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Progress of a long node-side job, as the controller shows it while the user waits.

A node-side job (a model pull over the fabric, a Hugging Face download) runs detached on its node
(``_jobs.py``). Every ``interval`` seconds the controller's action plugin runs the module again with
``job: status``; the node measures what is on its disk and answers with a **sample**::

    {"t": 8123.4,                  # the node's CLOCK_MONOTONIC when measured (one clock per node)
     "bytes_done": 39943210000,    # bytes of the job's files present on the node's disk
     "bytes_total": 127775277056,
     "files_done": 12, "files_total": 41,
     "phase": "downloading"}       # optional: what the job does when there are no totals yet

``RateMeter`` turns successive samples into a rate (over a sliding window of the node's own
timestamps, so the controller's SSH round trips do not distort it) and an ETA; ``progress_line``
and ``summary_line`` word them:

    spark2: model pull 37.2/119.0 GiB, 12/41 files, 1.9 GiB/s, ETA 43 s
    spark2: model pull done: 119.0 GiB in 41 files, 1 min 2 s, mean 1.9 GiB/s

``watch`` is the controller's loop, with the module run, the printer, the clock and the sleep
passed in. Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable, Deque, Mapping, Optional

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

# The rate is taken over the samples of the last WINDOW seconds (at least two samples).
WINDOW = 20.0
# Consecutive status runs that may fail (an SSH hiccup) before the watch gives up on the node.
MISSED_POLLS = 3


def _unit(value: float) -> int:
    """Index into _UNITS for ``value`` bytes."""
    index = 0
    value = abs(float(value))
    while value >= 1024 and index < len(_UNITS) - 1:
        value /= 1024
        index += 1
    return index


def format_bytes(value: float) -> str:
    """``0`` -> ``0 B``, ``1536`` -> ``1.5 KiB``, ``127775277056`` -> ``119.0 GiB`` (binary units, one decimal)."""
    index = _unit(value)
    if index == 0:
        return "%d B" % value
    return "%.1f %s" % (value / 1024 ** index, _UNITS[index])


def format_pair(done: float, total: float) -> str:
    """``done/total`` in the unit of ``total``: ``37.2/119.0 GiB`` (``0/0 B`` for an empty job)."""
    index = _unit(max(total, done))
    if index == 0:
        return "%d/%d B" % (done, total)
    scale = 1024 ** index
    return "%.1f/%.1f %s" % (done / scale, total / scale, _UNITS[index])


def format_rate(bytes_per_second: float) -> str:
    """``2040109465.6`` -> ``1.9 GiB/s``."""
    return format_bytes(bytes_per_second) + "/s"


def format_duration(seconds: float) -> str:
    """``43`` -> ``43 s``, ``725`` -> ``12 min 5 s``, ``7380`` -> ``2 h 03 min``; rounded up to a whole second."""
    total = int(math.ceil(max(0.0, seconds)))
    if total < 60:
        return "%d s" % total
    if total < 3600:
        return "%d min %d s" % (total // 60, total % 60)
    return "%d h %02d min" % (total // 3600, total % 3600 // 60)


class ProgressError(MultinodeError, ValueError):
    """A sample that is not one (missing or negative numbers); the message names the field."""


def check_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The sample with its numbers checked (missing counts are 0), or ProgressError naming the first bad field."""
    checked = dict(sample)
    for key in ("t", "bytes_done", "bytes_total", "files_done", "files_total"):
        value = sample.get(key, None if key == "t" else 0)  # only the time is required (no totals while listing)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ProgressError("progress sample: %s must be a number >= 0, got %r" % (key, value))
        checked[key] = value
    return checked


class RateMeter:
    """Rate and ETA from successive samples of one job (the node's timestamps, a sliding window)."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self.samples: Deque[tuple[float, float]] = deque()
        self.last: Optional[dict[str, Any]] = None
        self.moved_at: Optional[float] = None  # node time of the last sample that had more bytes

    def add(self, sample: Mapping[str, Any]) -> None:
        sample = check_sample(sample)
        if not sample["bytes_total"] and not sample["files_total"]:
            self.last = sample  # before the totals are known (listing): a phase, not a measurement
            return
        t, done = float(sample["t"]), float(sample["bytes_done"])
        if self.samples and (t <= self.samples[-1][0] or done < self.samples[-1][1]):
            # The node's clock cannot go back; bytes go back only when a file starts again from byte 0
            # (a corrupt resumed partial): the old samples no longer describe this transfer.
            if t <= self.samples[-1][0]:
                return
            self.samples.clear()
            self.moved_at = t
        if not self.samples or done > self.samples[-1][1]:
            self.moved_at = t
        self.samples.append((t, done))
        while len(self.samples) > 2 and t - self.samples[1][0] >= self.window:
            self.samples.popleft()
        self.last = sample

    def rate(self) -> Optional[float]:
        """Bytes per second over the window; None before two samples."""
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0)

    def eta(self) -> Optional[float]:
        """Seconds until ``bytes_total`` at the current rate; None while the rate is zero or known from two samples
        only (a download starts lumpy: huggingface_hub writes 10 MiB at a time per file, small files land first)."""
        rate = self.rate()
        if self.last is None or not rate or rate <= 0 or len(self.samples) < 3:
            return None
        return max(0.0, self.last["bytes_total"] - self.last["bytes_done"]) / rate

    def still_for(self) -> float:
        """Seconds (node time) since the bytes last grew; 0 while they grow."""
        if self.last is None or self.moved_at is None:
            return 0.0
        return float(self.last["t"]) - self.moved_at


def progress_line(host: str, what: str, meter: RateMeter) -> str:
    """``spark2: model pull 37.2/119.0 GiB, 12/41 files, 1.9 GiB/s, ETA 43 s`` for the meter's last sample.

    Before the totals are known the sample's ``phase`` is shown; before a rate is known ``rate -``; when the
    bytes stopped growing for a whole window, how long (a stall is visible, not averaged away).
    """
    sample = meter.last or {}
    if not sample or (not sample.get("files_total") and sample.get("phase")):
        return "%s: %s %s" % (host, what, sample.get("phase") or "starting")
    head = "%s: %s %s, %d/%d files" % (host, what, format_pair(sample["bytes_done"], sample["bytes_total"]),
                                       sample["files_done"], sample["files_total"])
    still = meter.still_for()
    if still >= meter.window and sample["bytes_done"] < sample["bytes_total"]:
        return "%s, no progress for %s" % (head, format_duration(still))
    rate, eta = meter.rate(), meter.eta()
    return "%s, %s, ETA %s" % (head, "rate -" if rate is None else format_rate(rate),
                               "-" if eta is None else format_duration(eta))


def summary_line(host: str, what: str, size: float, files: int, seconds: float, note: str = "") -> str:
    """``spark2: model pull done: 119.0 GiB in 41 files, 1 min 2 s, mean 1.9 GiB/s`` (what this run moved)."""
    mean = format_rate(size / seconds) if seconds > 0 else "-"
    return "%s: %s done: %s in %d file%s, %s, mean %s%s" % (
        host, what, format_bytes(size), files, "" if files == 1 else "s", format_duration(seconds), mean,
        "; " + note if note else "")


def watch(poll: Callable[[], Mapping[str, Any]], say: Callable[[str], None], host: str, what: str,
          interval: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep, window: Optional[float] = None) -> dict[str, Any]:
    """Poll a started job every ``interval`` seconds, ``say`` a progress line each time, return its last status.

    ``poll()`` is one status run of the module on the node: ``{"job_state": "running", "progress": sample}`` while
    the job runs, its result with ``job_state`` ``done`` (or ``lost``, failed) at the end. A poll that did not
    reach the node (no ``job_state``: unreachable, a module error) is retried; after ``MISSED_POLLS`` in a row the
    last one is returned, failed, saying the job may still run there.
    """
    meter = RateMeter(window if window is not None else max(WINDOW, 3 * interval))
    missed = 0
    next_poll = clock() + interval
    while True:
        sleep(max(0.0, next_poll - clock()))
        next_poll = clock() + interval
        status = dict(poll())
        state = status.get("job_state")
        if state is None:
            missed += 1
            if missed >= MISSED_POLLS:
                status["failed"] = True
                status["msg"] = ("%s: lost track of the %s after %d status runs failed (last: %s); the job may still "
                                 "run on %s" % (host, what, missed, status.get("msg", "no answer"), host))
                return status
            continue
        missed = 0
        if state != "running":
            return status
        try:
            meter.add(status.get("progress") or {})
        except ProgressError:
            continue
        say(progress_line(host, what, meter))


def run_watched(run_module: Callable[[str], Mapping[str, Any]], say: Callable[[str], None], host: str, what: str,
                interval: float, summarize: Callable[[Mapping[str, Any]], Optional[str]],
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The action plugins' flow: ``run_module("start")``, ``watch`` its ``run_module("status")``, a summary line.

    A start that fails, or that answers with a plain result (nothing to do: no ``job_state: started``), is returned
    as it is. The final result is the job's, without ``job_state``; ``summarize`` words its summary line (None: none).
    """
    started = dict(run_module("start"))
    if started.get("failed") or started.get("job_state") != "started":
        started.pop("job_state", None)
        return started
    if started.get("adopted"):
        say("%s: a %s started before (pid %s) is still running: watching it" % (host, what, started.get("pid")))
    final = watch(lambda: run_module("status"), say, host, what, interval, clock=clock, sleep=sleep)
    final.pop("job_state", None)
    if not final.get("failed"):
        line = summarize(final)
        if line:
            say(line)
    return final
