# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_transfer's background pull (job start/status), as the action plugin runs it: a real detached sender on
loopback, a real detached puller, the module's main() for every step.

The one stand-in: a slow network. The puller's receive is wrapped so that it stops after the first MiB of the
large file until the test releases it (a file flag: the puller is another process); everything else is real.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _transfer
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest, load_cache
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import spawn_sender, stop_sender
from ansible_collections.multinode.vllm.plugins.modules import model_transfer

LO = "127.0.0.1"
TOKEN = "one-time-token-of-the-test-0123456789"
HOLD = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LO, 0))
        return sock.getsockname()[1]


@pytest.fixture
def head(tmp_path):
    root = tmp_path / "head"
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(os.urandom(3 * HOLD + 11))
    (root / "sub" / "tokenizer.json").write_bytes(b"{}" * 100)
    entries = build_manifest(str(root))[0]["files"]
    port = free_port()
    spawn_sender(LO, port, str(root), [e["path"] for e in entries], TOKEN, {LO: "spark2"}, 60, str(tmp_path / "head-state"))
    yield entries, port
    stop_sender(port, None)


@pytest.fixture
def held(monkeypatch, tmp_path):
    """The puller receives the first MiB of a large file, then waits for the release file."""
    release = tmp_path / "release"
    original = _transfer.receive_stream

    def slow(sock, fd, digest, count, **kwargs):
        if count <= HOLD:
            return original(sock, fd, digest, count, **kwargs)
        got = original(sock, fd, digest, HOLD, **kwargs)
        while not release.exists():
            time.sleep(0.01)
        return got + original(sock, fd, digest, count - got, **kwargs)

    monkeypatch.setattr(_transfer, "receive_stream", slow)
    return release


def _args(tmp_path, entries, port, **extra):
    args = {"mode": "pull", "host": "spark2", "path": str(tmp_path / "worker"), "fabric_ip": LO, "server_ip": LO,
            "port": port, "token": TOKEN, "files": entries, "fsync": False, "cache_dir": str(tmp_path / "cache"),
            "state_dir": str(tmp_path / "worker-state")}
    args.update(extra)
    return args


def _until(run, args, predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while True:
        code, result = run(args)
        if predicate(result) or time.monotonic() > deadline:
            return code, result
        time.sleep(0.02)


def test_a_background_pull_reports_its_progress_then_its_result(run_main, head, held, tmp_path):
    entries, port = head

    def run(args):
        return run_main(model_transfer.main, args)

    code, started = run(_args(tmp_path, entries, port, job="start"))
    assert code == 0 and started["job_state"] == "started" and started["pid"] > 0, started
    # Midway: the tokenizer is in place, the model holds at the first MiB in its .partial.
    status_args = _args(tmp_path, entries, port, job="status")
    code, status = _until(run, status_args, lambda r: r.get("progress", {}).get("bytes_done", 0) >= HOLD)
    assert code == 0 and status["job_state"] == "running", status
    progress = status["progress"]
    assert progress["bytes_total"] == sum(e["size"] for e in entries) and progress["files_total"] == 2
    assert HOLD <= progress["bytes_done"] < progress["bytes_total"]
    assert progress["bytes_done"] in (HOLD, HOLD + 200)  # the tokenizer (200 bytes) may be in place already
    assert isinstance(progress["t"], float)
    assert (tmp_path / "worker" / "model.safetensors.partial").stat().st_size == HOLD
    held.touch()
    code, final = _until(run, status_args, lambda r: r.get("job_state") != "running")
    assert code == 0 and final["job_state"] == "done" and final["changed"] is True, final
    assert sorted(r["path"] for r in final["received"]) == sorted(e["path"] for e in entries)
    assert final["bytes"] == sum(e["size"] for e in entries) and final["server"] == "%s:%d" % (LO, port)
    assert build_manifest(str(tmp_path / "worker"))[0]["files"] == entries
    # The pull's hashes went into the worker's cache, as a foreground pull's do.
    assert set(load_cache(str(tmp_path / "cache"), str(tmp_path / "worker"))) == {e["path"] for e in entries}


def test_a_background_pull_that_fails_returns_the_message_of_the_foreground_one(run_main, head, tmp_path):
    entries, port = head

    def run(args):
        return run_main(model_transfer.main, args)

    wrong = [dict(e, sha256="0" * 64) if e["path"] == "sub/tokenizer.json" else e for e in entries]
    code, started = run(_args(tmp_path, wrong, port, job="start"))
    assert code == 0 and started["job_state"] == "started"
    code, final = _until(run, _args(tmp_path, wrong, port, job="status"), lambda r: r.get("job_state") != "running")
    assert code == 1 and final["failed"] and final["job_state"] == "done"
    assert final["msg"].startswith("spark2: sub/tokenizer.json arrived with sha256 "), final["msg"]
    assert final["msg"].endswith("expected %s; the partial file was removed, run again" % ("0" * 64))


def test_nothing_to_pull_starts_nothing_and_check_mode_never_starts(run_main, head, tmp_path):
    entries, port = head

    def run(args):
        return run_main(model_transfer.main, args)

    code, result = run(_args(tmp_path, [], port, job="start"))
    assert code == 0 and (result["changed"], result["received"], result["bytes"]) == (False, [], 0)
    assert "job_state" not in result
    code, result = run(dict(_args(tmp_path, entries, port, job="start"), _ansible_check_mode=True))
    assert code == 0 and result["changed"] and "job_state" not in result
    assert sorted(result["would_receive"]) == sorted(e["path"] for e in entries)
    assert not (tmp_path / "worker-state").exists()


def test_status_without_a_started_pull_says_so(run_main, tmp_path):
    code, result = run_main(model_transfer.main, _args(tmp_path, [], 29510, job="status"))
    assert code == 1 and result["job_state"] == "none"
    assert result["msg"] == "spark2: no model pull was started in %s/pull-29510" % (tmp_path / "worker-state")


def test_the_token_is_in_no_job_file(run_main, head, held, tmp_path):
    entries, port = head
    run_main(model_transfer.main, _args(tmp_path, entries, port, job="start"))
    held.touch()
    _until(lambda args: run_main(model_transfer.main, args), _args(tmp_path, entries, port, job="status"),
           lambda r: r.get("job_state") != "running")
    job_dir = tmp_path / "worker-state" / ("pull-%d" % port)
    for name in os.listdir(job_dir):
        assert TOKEN not in (job_dir / name).read_text(), name
