# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Detached jobs: real forked processes, their result file, a job that dies, a job still running."""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _jobs
from ansible_collections.multinode.vllm.plugins.module_utils._jobs import (
    JOB_FILE,
    RESULT_FILE,
    JobError,
    claim,
    job_state,
    process_start,
    read_json,
    start_job,
    write_json,
)


def wait_for(job_dir, states=("done", "lost"), seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state, job = job_state(job_dir)
        if state in states:
            return state, job
        time.sleep(0.02)
    raise AssertionError("job in %s still %s after %g s" % (job_dir, state, seconds))


def test_write_json_is_atomic_and_private(tmp_path):
    path = str(tmp_path / "a.json")
    write_json(path, {"a": 1})
    assert read_json(path) == {"a": 1} and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left
    assert read_json(str(tmp_path / "missing.json")) is None
    (tmp_path / "bad.json").write_text("{half")
    assert read_json(str(tmp_path / "bad.json")) is None


def test_process_start_of_this_process_a_zombie_and_nonsense():
    assert isinstance(process_start(os.getpid()), int)
    for pid in (None, True, -1, 0, "12", 2 ** 22 + 7):
        assert process_start(pid) is None
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os._exit(0)
    deadline = time.monotonic() + 5
    while process_start(child) is not None and time.monotonic() < deadline:  # a zombie until reaped
        time.sleep(0.01)
    assert process_start(child) is None
    os.waitpid(child, 0)


def test_a_job_runs_detached_and_leaves_its_result(tmp_path):
    job_dir = str(tmp_path / "state" / "job")
    marker = tmp_path / "marker"

    def work():
        while not marker.exists():
            time.sleep(0.01)
        return {"changed": True, "pid_seen": os.getpid()}

    job = start_job(job_dir, "test job", {"request": {"a": 1}}, work)
    assert job["pid"] > 0 and job["pid"] != os.getpid() and job["adopted"] is False
    assert stat.S_IMODE(os.stat(job_dir).st_mode) == 0o700
    state, record = job_state(job_dir)
    assert state == "running" and record["record"] == {"request": {"a": 1}} and record["what"] == "test job"
    marker.touch()
    state, record = wait_for(job_dir)
    assert state == "done" and record["result"] == {"changed": True, "pid_seen": job["pid"]}


def test_an_exception_in_the_work_is_its_result(tmp_path):
    job_dir = str(tmp_path / "job")

    def work():
        raise ValueError("spark2: something named and explained")

    start_job(job_dir, "test job", {}, work)
    state, record = wait_for(job_dir)
    assert state == "done" and record["result"] == {"failed": True, "msg": "spark2: something named and explained"}


def test_a_killed_job_is_lost_not_running(tmp_path):
    job_dir = str(tmp_path / "job")
    job = start_job(job_dir, "test job", {}, lambda: time.sleep(60) or {})
    assert job_state(job_dir)[0] == "running"
    os.kill(job["pid"], signal.SIGKILL)
    state, record = wait_for(job_dir)
    assert state == "lost" and record["pid"] == job["pid"] and not os.path.exists(os.path.join(job_dir, RESULT_FILE))


def test_a_job_that_ends_between_the_two_reads_is_done_not_lost(tmp_path, monkeypatch):
    """The race CI hit once: the result was not there yet, then the process was gone. A stand-in for
    process_start makes that interleaving certain (a real one lines up only now and then): it writes the
    result, as the job does just before it exits, and reports the process gone."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    write_json(str(job_dir / JOB_FILE), {"pid": os.getpid(), "pid_start": process_start(os.getpid())})

    def ends_now(pid):
        write_json(str(job_dir / RESULT_FILE), {"changed": True})
        return None

    monkeypatch.setattr(_jobs, "process_start", ends_now)
    state, record = job_state(str(job_dir))
    assert state == "done" and record["result"] == {"changed": True}


def test_a_reused_pid_is_not_taken_for_the_job(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    # This very process, recorded with another start time: a pid the kernel gave to someone else since.
    write_json(str(job_dir / JOB_FILE), {"pid": os.getpid(), "pid_start": process_start(os.getpid()) + 1})
    assert job_state(str(job_dir))[0] == "lost"
    assert job_state(str(tmp_path / "nothing"))[0] == "none"


def test_a_running_job_of_the_same_request_is_adopted_another_is_refused_by_pid(tmp_path):
    job_dir = str(tmp_path / "job")
    job = start_job(job_dir, "download", {"request": {"repo": "a"}}, lambda: time.sleep(60) or {})
    try:
        again = start_job(job_dir, "download", {"request": {"repo": "a"}}, lambda: {"wrong": True}, adopt=True)
        assert again["adopted"] is True and again["pid"] == job["pid"]
        with pytest.raises(JobError) as caught:
            start_job(job_dir, "download", {"request": {"repo": "b"}}, lambda: {}, adopt=True, wait_previous=0.3)
        assert "a previous download (pid %d, started " % job["pid"] in str(caught.value)
        assert "kill %d" % job["pid"] in str(caught.value) and job_dir in str(caught.value)
    finally:
        os.kill(job["pid"], signal.SIGKILL)
    # Once it is gone, the directory is cleared for the next job.
    wait_for(job_dir)
    assert claim(job_dir, "download") is None and os.listdir(job_dir) == []


def test_a_previous_job_that_ends_in_time_is_waited_for(tmp_path):
    job_dir = str(tmp_path / "job")
    start_job(job_dir, "pull", {}, lambda: time.sleep(0.5) or {"first": True})
    start_job(job_dir, "pull", {}, lambda: {"second": True}, wait_previous=10)
    assert wait_for(job_dir)[1]["result"] == {"second": True}


def test_a_link_at_the_job_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(str(target), str(tmp_path / "job"))
    with pytest.raises(JobError, match="is not a directory; remove it"):
        claim(str(tmp_path / "job"), "pull")
    assert (target / "keep").read_text() == "x"


def test_the_job_file_holds_what_status_runs_need(tmp_path):
    job_dir = str(tmp_path / "job")
    start_job(job_dir, "pull", {"root": "/m", "entries": [{"path": "a", "size": 1}]}, lambda: {})
    wait_for(job_dir)
    with open(os.path.join(job_dir, JOB_FILE)) as handle:
        data = json.load(handle)
    assert set(data) == {"what", "record", "started", "pid", "pid_start", "adopted"}
    assert data["record"]["entries"] == [{"path": "a", "size": 1}]
