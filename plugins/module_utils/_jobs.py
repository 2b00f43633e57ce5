# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A long node-side job that outlives the module run that started it, so the controller can watch it.

An Ansible task shows its output only when it ends. To show progress while a model pull or a Hugging Face
download runs, the module starts the work in a detached process (``_detach.run_detached``, as the model
sender and the fabric probe listener are started) and returns at once; the action plugin then runs the
module again every few seconds to read the job's state (``job_state``) and measure its progress.

A job is a directory private to root (0700), one per kind of job on a node (a second pull on the same port
would collide on the same files anyway):

* ``job.json``: written by the starting module once the detached process runs: what the job does
  (``record``), when it started, its pid and kernel start time (so a reused pid is not mistaken for it);
* ``result.json``: written once by the detached process when the work ends: what the module would have
  returned, or ``failed``/``msg``.

Both are written atomically (a temporary file renamed over the name), so a reader never sees half a file.
A job without a result whose process is gone ended abnormally (killed, out of memory): ``lost``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Callable, Mapping, Optional

from ansible_collections.multinode.vllm.plugins.module_utils._detach import run_detached
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

JOB_FILE = "job.json"
RESULT_FILE = "result.json"


class JobError(MultinodeError):
    """A job cannot be started or read; the message names the job directory and what to do."""


def write_json(path: str, data: Any, mode: int = 0o600) -> None:
    """Write ``data`` as JSON to ``path`` atomically (readers see the old file or the new one, never half)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str) -> Optional[Any]:
    """The JSON document at ``path``, or None when it is missing or not JSON."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def process_start(pid: Any) -> Optional[int]:
    """The kernel start time (clock ticks since boot) of a live process ``pid``; None when it is gone or a zombie."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        with open("/proc/%d/stat" % pid) as handle:
            text = handle.read()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'.
    fields = text[text.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def job_state(job_dir: str) -> tuple[str, dict[str, Any]]:
    """(``none`` | ``running`` | ``done`` | ``lost``, the job record with ``result`` once done)."""
    job = read_json(os.path.join(job_dir, JOB_FILE))
    if not isinstance(job, dict):
        return "none", {}
    # Whether it lives is read before its result: the job writes its result before it exits, so one found gone has
    # left its result already. Read the other way round, a job that ended between the two reads was called lost
    # (CI saw it once).
    start = process_start(job.get("pid"))
    result = read_json(os.path.join(job_dir, RESULT_FILE))
    if isinstance(result, dict):
        return "done", dict(job, result=result)
    if start is not None and start == job.get("pid_start"):
        return "running", job
    return "lost", job


def _run(job_dir: str, work: Callable[[], Mapping[str, Any]]) -> None:  # pragma: no cover - detached process
    os.chdir("/")
    try:
        result = dict(work())
    except BaseException as exc:  # pylint: disable=broad-except  # every end of the work leaves a result
        result = {"failed": True, "msg": str(exc) or type(exc).__name__}
    write_json(os.path.join(job_dir, RESULT_FILE), result)


def claim(job_dir: str, what: str, request: Any = None, adopt: bool = False,
          wait_previous: float = 10.0) -> Optional[dict[str, Any]]:
    """Make ``job_dir`` an empty directory (0700) for a new job and return None; or return the running job to adopt.

    A previous job still running there is adopted (watched instead of started again) when ``adopt`` and its
    ``record["request"]`` equals ``request`` (a play interrupted and run again while the download goes on);
    otherwise it has ``wait_previous`` seconds to end before this refuses, naming its pid.
    """
    state, previous = job_state(job_dir)
    if state == "running" and adopt and previous.get("record", {}).get("request") == request:
        return previous
    deadline = time.monotonic() + wait_previous
    while state == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
        state, previous = job_state(job_dir)
    if state == "running":
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(previous.get("started", 0)))
        raise JobError("a previous %s (pid %s, started %s) still runs and writes into %s; wait for it to end or "
                       "stop it (kill %s), then run again" % (what, previous.get("pid"), started, job_dir,
                                                              previous.get("pid")))
    if os.path.lexists(job_dir):
        if os.path.islink(job_dir) or not os.path.isdir(job_dir):
            raise JobError("%s is not a directory; remove it and run again" % job_dir)
        shutil.rmtree(job_dir)
    os.makedirs(job_dir, mode=0o700)
    return None


def start_job(job_dir: str, what: str, record: Mapping[str, Any], work: Callable[[], Mapping[str, Any]],
              adopt: bool = False, wait_previous: float = 10.0) -> dict[str, Any]:
    """Start ``work`` in a detached process that writes its result into ``job_dir``; returns the job record
    (with ``adopted`` true when a running job of the same ``record["request"]`` was found instead, see ``claim``)."""
    previous = claim(job_dir, what, record.get("request"), adopt, wait_previous)
    if previous is not None:
        return dict(previous, adopted=True)
    started = time.time()
    pid = run_detached(lambda: _run(job_dir, work), ())
    # Written once the pid is known; the work never reads it (what it needs, it gets from ``work``'s closure).
    job = {"what": what, "record": dict(record), "started": started, "pid": pid, "pid_start": process_start(pid),
           "adopted": False}
    write_json(os.path.join(job_dir, JOB_FILE), job)
    return job
