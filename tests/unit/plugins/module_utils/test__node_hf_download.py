# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Hugging Face download's plan, its measurement from the cache on disk, and what a failure is about.

No Hub and no huggingface_hub here (tests/unit/plugins/modules/test_model_hf_download.py runs the real library
against a local fake Hub when the lab's node venv is there). What stands in for what:

* ``FakeDownloader`` stands in for ``snapshot_download``: it really writes the files into a Hugging Face cache
  as huggingface_hub 2.4 does (``blobs/<etag>.<8 hex>.incomplete`` written in chunks, renamed to
  ``blobs/<etag>``, linked from ``snapshots/<commit>/<path>``), in a thread, one chunk per ``step()``;
* ``plan_of`` stands in for the Hub's file list (``HfApi.repo_info`` + ``list_repo_tree``);
* exception classes named like huggingface_hub's and httpx's stand in for them: ``classify`` reads class names
  (it imports nothing from huggingface_hub, so the module can measure under Ansible's python).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _node_hf_download
from ansible_collections.multinode.vllm.plugins.module_utils._node_hf_download import (
    PLAN,
    DiskSpaceError,
    classify,
    download,
    measure,
    plan_files,
    scrub,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MIB = 1024 * 1024


def test_plan_files_names_each_blob_by_its_etag():
    files = plan_files([
        {"path": "model.safetensors", "size": 135, "blob_id": "a" * 40, "lfs_sha256": "b" * 64, "lfs_size": 5 * MIB},
        {"path": "config.json", "size": 519, "blob_id": "c" * 40, "lfs_sha256": None, "lfs_size": None},
    ])
    assert files == [{"path": "config.json", "size": 519, "blob": "c" * 40},
                     {"path": "model.safetensors", "size": 5 * MIB, "blob": "b" * 64}]


class FakeDownloader:
    """Writes ``files`` (path -> bytes, all LFS) into ``cache`` the way huggingface_hub 2.4 does, a chunk per step."""

    def __init__(self, cache, files, chunk=MIB, repo="org/tiny"):
        self.storage = os.path.join(cache, "models--" + repo.replace("/", "--"))
        self.files, self.chunk = files, chunk
        self.steps = threading.Semaphore(0)
        self.calls = []

    def plan(self, request=None):
        return {"repo_id": "org/tiny", "commit": COMMIT, "storage": self.storage,
                "files": plan_files({"path": p, "size": len(d), "blob_id": "0" * 40,
                                     "lfs_sha256": hashlib.sha256(d).hexdigest(), "lfs_size": len(d)}
                                    for p, d in self.files.items())}

    def step(self, count=1):
        for _step in range(count):
            self.steps.release()

    def __call__(self, local_files_only=False, **kwargs):
        self.calls.append(dict(kwargs, local_files_only=local_files_only))
        snapshot = os.path.join(self.storage, "snapshots", COMMIT)
        complete = all(os.path.exists(os.path.join(snapshot, p)) for p in self.files)
        if local_files_only:
            if not complete:
                raise FileNotFoundError("LocalEntryNotFoundError stand-in: not in the cache")
            return snapshot
        blobs = os.path.join(self.storage, "blobs")
        os.makedirs(blobs, exist_ok=True)
        for path, data in sorted(self.files.items()):
            blob = os.path.join(blobs, hashlib.sha256(data).hexdigest())
            if not os.path.exists(blob):
                tmp = blob + ".%s.incomplete" % os.urandom(4).hex()
                with open(tmp, "wb") as handle:
                    for start in range(0, len(data), self.chunk):
                        assert self.steps.acquire(timeout=10), "the test did not step the download"
                        handle.write(data[start:start + self.chunk])
                        handle.flush()
                os.replace(tmp, blob)
            link = os.path.join(snapshot, path)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            if not os.path.lexists(link):
                os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
        return snapshot


def _wait(predicate, seconds=10.0):
    import time
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _request(tmp_path, **extra):
    request = {"repo_id": "org/tiny", "revision": "", "cache_dir": str(tmp_path / "cache"), "allow_patterns": []}
    request.update(extra)
    return request


def test_the_measure_follows_a_download_chunk_by_chunk(tmp_path):
    files = {"model.safetensors": os.urandom(3 * MIB), "config.json": b'{"a": 1}'}
    fake = FakeDownloader(str(tmp_path / "cache"), files)
    job = tmp_path / "job"
    job.mkdir()
    box = {}

    def run():
        box["outcome"] = download(str(job), _request(tmp_path), plan_of=fake.plan, snapshot=fake)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        _wait((job / PLAN).exists)
        plan = json.loads((job / PLAN).read_text())
        assert plan["present"] == {"bytes_done": 0, "bytes_total": 3 * MIB + 8, "files_done": 0, "files_total": 2}
        assert measure(plan) == plan["present"]
        fake.step()  # config.json, written and renamed: a whole file
        _wait(lambda: measure(plan)["files_done"] == 1)
        assert measure(plan) == {"bytes_done": 8, "bytes_total": 3 * MIB + 8, "files_done": 1, "files_total": 2}
        fake.step()  # the first MiB of the model, in its .incomplete
        _wait(lambda: measure(plan)["bytes_done"] == MIB + 8)
        fake.step(2)
        thread.join(10)
    finally:
        fake.step(10)
        thread.join(10)
    outcome = box["outcome"]
    assert outcome["ok"] and outcome["cached"] is False and outcome["commit"] == COMMIT
    assert outcome["bytes"] == 3 * MIB + 8 and outcome["files"] == 2 and outcome["path"].endswith(COMMIT)
    assert measure(plan) == {"bytes_done": 3 * MIB + 8, "bytes_total": 3 * MIB + 8, "files_done": 2, "files_total": 2}
    # Asked first from the cache only, then downloaded, with the request's arguments.
    assert [c["local_files_only"] for c in fake.calls] == [True, False]
    assert fake.calls[1]["cache_dir"] == str(tmp_path / "cache") and fake.calls[1]["allow_patterns"] is None


def test_a_snapshot_in_the_cache_is_not_planned_or_downloaded_again(tmp_path):
    fake = FakeDownloader(str(tmp_path / "cache"), {"config.json": b"{}"})
    fake.step()
    fake()
    plans = []
    outcome = download(str(tmp_path), _request(tmp_path), plan_of=lambda r: plans.append(r) or fake.plan(), snapshot=fake)
    assert outcome["ok"] and outcome["cached"] is True and plans == []


def test_check_mode_plans_and_downloads_nothing(tmp_path):
    fake = FakeDownloader(str(tmp_path / "cache"), {"a.bin": os.urandom(1000), "b.json": b"{}"})
    outcome = download(str(tmp_path), _request(tmp_path, check=True), plan_of=fake.plan, snapshot=fake)
    assert outcome == {"ok": True, "token": False, "commit": COMMIT, "cached": False,
                       "would_download": {"files": 2, "bytes": 1002}}
    assert [c["local_files_only"] for c in fake.calls] == [True]


def test_stale_incomplete_files_of_a_killed_download_are_not_progress(tmp_path):
    data = os.urandom(2 * MIB)
    fake = FakeDownloader(str(tmp_path / "cache"), {"m.safetensors": data})
    plan = fake.plan()
    blobs = os.path.join(fake.storage, "blobs")
    os.makedirs(blobs)
    stale = hashlib.sha256(data).hexdigest() + ".dead0000.incomplete"
    with open(os.path.join(blobs, stale), "wb") as handle:
        handle.write(data[:MIB])
    assert measure(plan)["bytes_done"] == MIB
    assert measure(plan, ignore=[stale])["bytes_done"] == 0


def test_a_sparse_incomplete_file_counts_its_written_blocks_not_its_length(tmp_path):
    data = os.urandom(8 * MIB)
    fake = FakeDownloader(str(tmp_path / "cache"), {"m.safetensors": data})
    blobs = os.path.join(fake.storage, "blobs")
    os.makedirs(blobs)
    path = os.path.join(blobs, hashlib.sha256(data).hexdigest() + ".0badcafe.incomplete")
    with open(path, "wb") as handle:
        handle.truncate(8 * MIB)  # the length set first, nothing written
        handle.write(data[:MIB])
    st = os.stat(path)
    if st.st_blocks * 512 >= st.st_size:
        pytest.skip("this filesystem does not keep sparse files")
    assert MIB <= measure(fake.plan())["bytes_done"] < 2 * MIB


def test_no_room_for_the_missing_files_fails_before_downloading(tmp_path, monkeypatch):
    fake = FakeDownloader(str(tmp_path / "cache"), {"big.safetensors": os.urandom(1000)})
    monkeypatch.setattr(_node_hf_download, "free_space", lambda path: (str(tmp_path), 999))
    outcome = download(str(tmp_path), _request(tmp_path), plan_of=fake.plan, snapshot=fake)
    assert outcome["ok"] is False and outcome["kind"] == "disk"
    assert (outcome["needed"], outcome["free"], outcome["where"]) == (1000, 999, str(tmp_path))
    assert [c["local_files_only"] for c in fake.calls] == [True]  # never asked to download


# Stand-ins named like huggingface_hub's error classes (errors.py) and httpx's, with their hierarchy.
class HTTPError(OSError):
    pass


class HfHubHTTPError(HTTPError):
    def __init__(self, message, status=None):
        super().__init__(message)
        self.response = type("Response", (), {"status_code": status})()


class RepositoryNotFoundError(HfHubHTTPError):
    pass


class GatedRepoError(RepositoryNotFoundError):
    pass


class RevisionNotFoundError(HfHubHTTPError):
    pass


class DisabledRepoError(HfHubHTTPError):
    pass


class EntryNotFoundError(Exception):
    pass


class LocalEntryNotFoundError(FileNotFoundError, EntryNotFoundError):
    pass


class IncompleteSnapshotError(LocalEntryNotFoundError):
    pass


class OfflineModeIsEnabled(ConnectionError):
    pass


class ConnectError(Exception):  # httpx2.ConnectError
    pass


class ProxyError(Exception):  # httpx2.ProxyError
    pass


def _raised_from(outer, inner):
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:  # pylint: disable=broad-except
        return exc


@pytest.mark.parametrize("exc, offline, kind, status", [
    (GatedRepoError("403 Client Error. Cannot access gated repo", 403), False, "gated", 403),
    (RepositoryNotFoundError("401 Client Error. Repository Not Found", 401), False, "repo", 401),
    (RevisionNotFoundError("404 Client Error. Revision Not Found", 404), False, "revision", 404),
    (DisabledRepoError("403 Access to this resource is disabled.", 403), False, "disabled", 403),
    (HfHubHTTPError("401 Invalid credentials in Authorization header", 401), False, "auth", 401),
    (HfHubHTTPError("403 Forbidden", 403), False, "forbidden", 403),
    (HfHubHTTPError("429 Too Many Requests", 429), False, "rate_limit", 429),
    (HfHubHTTPError("503 Service Unavailable", 503), False, "hub_error", 503),
    (OfflineModeIsEnabled("Cannot reach https://huggingface.co: offline mode is enabled"), True, "offline", None),
    (LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder"), True, "offline", None),
    (IncompleteSnapshotError("The cached snapshot is incomplete"), False, "not_cached", None),
    (_raised_from(LocalEntryNotFoundError("check your internet connection"), ConnectError("[Errno -3] name")),
     False, "network", None),
    (_raised_from(LocalEntryNotFoundError("x"), ProxyError("407 Proxy Authentication Required")), False, "proxy", None),
    (OSError(errno.ENOSPC, "No space left on device"), False, "disk", None),
    (_raised_from(RuntimeError("write failed"), OSError(errno.EDQUOT, "Disk quota exceeded")), False, "disk", None),
    (DiskSpaceError("/cache", 10, 1), False, "disk", None),
    (PermissionError(errno.EACCES, "Permission denied", "/cache/blobs"), False, "permission", None),
    (ModuleNotFoundError("No module named 'huggingface_hub'"), False, "no_hub", None),
    (ValueError("something else"), False, "error", None),
])
def test_classify_names_the_cause(exc, offline, kind, status):
    result = classify(exc, offline=offline)
    assert (result["kind"], result["status"]) == (kind, status)
    assert result["error"].startswith(type(exc).__name__ + ": ")


def test_classify_keeps_the_error_on_one_line_and_short():
    result = classify(ValueError("line one\n\n  line two " + "x" * 1000))
    assert "\n" not in result["error"] and result["error"].startswith("ValueError: line one line two xxx")
    assert len(result["error"]) < 440 and result["error"].endswith("...")


def test_scrub_removes_a_secret_from_every_string_of_an_outcome():
    token = "hf_" + "T" * 34
    outcome = {"ok": False, "error": "401: token %s refused" % token, "nested": [{"a": token}], "status": 401}
    assert token not in json.dumps(scrub(outcome, [token, ""]))
    assert scrub(outcome, [token])["error"] == "401: token <redacted> refused"


def test_the_file_runs_standalone_under_another_python_without_the_collection(tmp_path):
    """What the module runs on the head: this file's source as ``python -c``, nothing of the collection importable."""
    import subprocess
    import sys

    request = tmp_path / "request.json"
    request.write_text(json.dumps(_request(tmp_path)))
    source = open(_node_hf_download.__file__).read()
    proc = subprocess.run([sys.executable, "-I", "-c", source, str(tmp_path)], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""), "HF_TOKEN": "hf_" + "Q" * 34}, check=False)
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    if outcome["kind"] != "no_hub":  # this python has huggingface_hub: it got as far as the (absent) Hub
        pytest.skip("huggingface_hub is importable here: %s" % outcome)
    assert proc.returncode == 1 and outcome["ok"] is False and outcome["token"] is True
    assert outcome["error"] == "ModuleNotFoundError: No module named 'huggingface_hub'"
