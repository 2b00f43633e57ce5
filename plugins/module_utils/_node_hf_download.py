# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Hugging Face download on the head, and how far it got. Standard library only, and self-contained.

This file has two lives:

* **the download** (``main``): ``model_hf_download`` runs this file's source with the node runtime's python
  (the one with huggingface_hub, ``model_python``): ``python -c <this file> JOB_DIR``, behind
  ``/bin/sh -c 'set -a && . "$0" && set +a && exec "$@"' TOKEN_FILE`` when there is a token, so ``HF_TOKEN``
  reaches it from a 0600 file only (``_secrets.SOURCE_ARGV``), never from a command line or Ansible's
  environment. It reads ``request.json`` from JOB_DIR, writes ``plan.json`` (the files it will fetch, with
  their sizes) before downloading, and ``outcome.json`` at the end: the snapshot path, or what went wrong
  (``classify``) with the token removed from every text;
* **the measurement** (``measure``): the module, run again by the action plugin while the download goes on,
  reads ``plan.json`` and counts the bytes of those files in the Hugging Face cache: a finished blob
  (``blobs/<etag>``) whole, one being written (``blobs/<etag>.<random>.incomplete`` in huggingface_hub 2.4)
  by its blocks on disk. That is what is really there, whatever huggingface_hub does between (its own
  progress bars are disabled; its byte totals grow as files start, so they cannot give an ETA).

The plan asks the Hub for the revision's file list (``HfApi.repo_info``, ``list_repo_tree`` with sizes),
filtered with huggingface_hub's own ``filter_repo_objects`` and ``allow_patterns``, as ``snapshot_download``
does. A file's blob is named by its etag: the LFS sha256 for an LFS file, the git blob id otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from typing import Any, Iterable, Mapping, Optional, Sequence

REQUEST = "request.json"
PLAN = "plan.json"
OUTCOME = "outcome.json"

# What an exception (or one it was raised from) says about the cause, most specific first. Names, not
# classes: this file imports nothing from huggingface_hub at module level (the module measures with it
# too, under Ansible's python), and the names are huggingface_hub's public error classes (errors.py)
# and httpx's transport errors.
_KINDS_BY_CLASS = (
    ("DiskSpaceError", "disk"),
    ("GatedRepoError", "gated"),
    ("RevisionNotFoundError", "revision"),
    ("DisabledRepoError", "disabled"),
    ("RepositoryNotFoundError", "repo"),
    ("OfflineModeIsEnabled", "offline"),
    ("ProxyError", "proxy"),
)
_NETWORK_CLASSES = {"ConnectError", "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError",
                    "RemoteProtocolError", "gaierror", "ConnectionError", "TimeoutError"}
_LOCAL_ONLY_CLASSES = {"LocalEntryNotFoundError", "IncompleteSnapshotError"}


class DiskSpaceError(OSError):
    """The cache's filesystem has less free space than the files still to download."""

    def __init__(self, path: str, needed: int, free: int) -> None:
        super().__init__(errno.ENOSPC, "needs %d bytes, %d free" % (needed, free), path)
        self.needed, self.free, self.path = needed, free, path


def write_json(path: str, data: Any) -> None:
    """Atomically (a temporary file renamed over the name), mode 0600."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def read_json(path: str) -> Optional[Any]:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------------
# The plan and its measurement (pure but for stat/listdir)
# ---------------------------------------------------------------------------


def plan_files(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plan's files from the repo tree's entries (``path``, ``size``, ``blob_id``, ``lfs_sha256``, ``lfs_size``).

    The cache names a file's blob by the etag the Hub sends for it: ``X-Linked-Etag``, the LFS sha256, for an
    LFS (or Xet) file; the ``ETag``, the git blob id, for any other (huggingface_hub's tree cache rebuilds it
    the same way, ``file_download._xet_file_metadata_from_tree_cache``).
    """
    files = []
    for entry in entries:
        lfs = entry.get("lfs_sha256")
        files.append({"path": str(entry["path"]),
                      "size": int(entry["lfs_size"] if lfs and entry.get("lfs_size") is not None else entry["size"]),
                      "blob": str(lfs or entry["blob_id"])})
    return sorted(files, key=lambda f: f["path"])


def _incomplete(blobs: str) -> dict[str, list[str]]:
    """blob name -> its ``.incomplete`` files in ``blobs`` (``<etag>.incomplete`` before 2.4, ``<etag>.<id>.incomplete`` since)."""
    found: dict[str, list[str]] = {}
    try:
        names = os.listdir(blobs)
    except OSError:
        return found
    for name in names:
        if name.endswith(".incomplete"):
            found.setdefault(name.split(".", 1)[0], []).append(name)
    return found


def _bytes_written(path: str) -> int:
    """Bytes really in a file being written: its size, but not more than its allocated blocks (a writer that
    sets the length first, or writes out of order, leaves a sparse file whose size says nothing)."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else min(st.st_size, blocks * 512)


def measure(plan: Mapping[str, Any], ignore: Sequence[str] = ()) -> dict[str, int]:
    """Bytes and files of the plan present in the cache: finished blobs whole, ``.incomplete`` ones as written.

    ``ignore``: ``.incomplete`` names left by an earlier, killed download (huggingface_hub 2.4 never resumes one:
    each download writes a file of its own and removes it on failure), listed when the plan was made.
    """
    blobs = os.path.join(str(plan["storage"]), "blobs")
    partial = _incomplete(blobs)
    skip = set(ignore)
    done = files = total = 0
    for item in plan["files"]:
        size = int(item["size"])
        total += size
        try:
            os.stat(os.path.join(blobs, item["blob"]))  # follows a link into huggingface_hub's shared Xet store
            done += size
            files += 1
            continue
        except OSError:
            pass
        written = [_bytes_written(os.path.join(blobs, name)) for name in partial.get(item["blob"], []) if name not in skip]
        done += min(size, max(written, default=0))
    return {"bytes_done": done, "bytes_total": total, "files_done": files, "files_total": len(plan["files"])}


def free_space(path: str) -> tuple[str, int]:
    """(the nearest existing directory at or above ``path``, its bytes available to a non-root writer)."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    return probe, st.f_bavail * st.f_frsize


def check_space(plan: Mapping[str, Any], present: Mapping[str, int]) -> None:
    """DiskSpaceError before a byte is downloaded when the files still missing do not fit."""
    needed = int(present["bytes_total"]) - int(present["bytes_done"])
    where, free = free_space(os.path.join(str(plan["storage"]), "blobs"))
    if needed > free:
        raise DiskSpaceError(where, needed, free)


# ---------------------------------------------------------------------------
# Why it failed
# ---------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during, outermost first (at most 10, no cycles)."""
    seen: list[BaseException] = []
    pending = [exc]
    while pending and len(seen) < 10:
        current = pending.pop(0)
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        pending.extend([current.__cause__, current.__context__])
    return seen


def _one_line(text: str, limit: int = 400) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def classify(exc: BaseException, offline: bool = False) -> dict[str, Any]:
    """``kind`` (what the module's message is about), ``status`` (HTTP, if any), ``error`` (class: text)."""
    chain = _chain(exc)
    names = [{cls.__name__ for cls in type(e).__mro__} for e in chain]
    status = None
    for item in chain:
        code = getattr(getattr(item, "response", None), "status_code", None)
        if isinstance(code, int):
            status = code
            break
    kind = "error"
    found = [k for name, k in _KINDS_BY_CLASS if any(name in n for n in names)]
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain):
        kind = "disk"
    elif any("ModuleNotFoundError" in n or "ImportError" in n for n in names[:1]):
        kind = "no_hub"
    elif found:
        kind = found[0]
    elif status == 401:
        kind = "auth"
    elif status == 403:
        kind = "forbidden"
    elif status == 429:
        kind = "rate_limit"
    elif status is not None and status >= 500:
        kind = "hub_error"
    elif any(n & _NETWORK_CLASSES for n in names):
        kind = "network"
    elif any(n & _LOCAL_ONLY_CLASSES for n in names):
        kind = "offline" if offline else "not_cached"
    elif any(isinstance(e, PermissionError) for e in chain):
        kind = "permission"
    detail = "%s: %s" % (type(exc).__name__, _one_line(str(exc)))
    result = {"kind": kind, "status": status, "error": detail}
    if isinstance(exc, DiskSpaceError):
        result.update(needed=exc.needed, free=exc.free, where=exc.path)
    return result


def scrub(text: Any, secrets: Iterable[str]) -> Any:
    """``text`` (or every string in a dict/list) with each secret replaced by ``<redacted>``."""
    if isinstance(text, dict):
        return {k: scrub(v, secrets) for k, v in text.items()}
    if isinstance(text, list):
        return [scrub(v, secrets) for v in text]
    if not isinstance(text, str):
        return text
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


# ---------------------------------------------------------------------------
# The download (runs under the node runtime's python)
# ---------------------------------------------------------------------------


def _hub_plan(request: Mapping[str, Any]) -> dict[str, Any]:  # pragma: no cover - needs huggingface_hub and a Hub
    from huggingface_hub import HfApi, constants
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    info = api.repo_info(request["repo_id"], revision=request["revision"] or None)
    tree = [f for f in api.list_repo_tree(request["repo_id"], recursive=True, revision=info.sha)
            if isinstance(f, RepoFile)]
    chosen = filter_repo_objects(tree, allow_patterns=request["allow_patterns"] or None, key=lambda f: f.path)
    cache = os.path.realpath(os.path.expanduser(request["cache_dir"] or constants.HF_HUB_CACHE))
    return {
        "repo_id": request["repo_id"], "commit": info.sha,
        "storage": os.path.join(cache, repo_folder_name(repo_id=request["repo_id"], repo_type="model")),
        "files": plan_files({"path": f.path, "size": f.size, "blob_id": f.blob_id,
                             "lfs_sha256": f.lfs.sha256 if f.lfs else None,
                             "lfs_size": f.lfs.size if f.lfs else None} for f in chosen),
    }


def download(job_dir: str, request: Mapping[str, Any], plan_of=_hub_plan, snapshot=None) -> dict[str, Any]:
    """Download (or, with ``request["check"]``, only plan) the snapshot; the outcome to write.

    ``plan_of`` and ``snapshot`` (huggingface_hub's ``snapshot_download``) are parameters so that a test can
    stand a local fake in for the Hub; the module always runs the real ones.
    """
    outcome: dict[str, Any] = {"ok": False, "token": bool(os.environ.get("HF_TOKEN"))}
    try:
        if snapshot is None:
            from huggingface_hub import snapshot_download as snapshot  # pylint: disable=import-outside-toplevel
        kwargs = {"repo_id": request["repo_id"], "revision": request["revision"] or None,
                  "cache_dir": request["cache_dir"] or None, "allow_patterns": request["allow_patterns"] or None}
        try:
            outcome.update(ok=True, cached=True, path=snapshot(local_files_only=True, **kwargs))
            return outcome
        except Exception:  # pylint: disable=broad-except  # not (fully) in the cache: plan and download
            pass
        plan = plan_of(request)
        stale = sorted(n for names in _incomplete(os.path.join(plan["storage"], "blobs")).values() for n in names)
        present = measure(plan, stale)
        write_json(os.path.join(job_dir, PLAN), dict(plan, ignore=stale, present=present))
        missing = {"files": present["files_total"] - present["files_done"],
                   "bytes": present["bytes_total"] - present["bytes_done"]}
        outcome.update(commit=plan["commit"], cached=False)
        if request.get("check"):
            outcome.update(ok=True, would_download=missing)
            return outcome
        check_space(plan, present)
        start = time.monotonic()
        path = snapshot(**kwargs)
        outcome.update(ok=True, path=path, seconds=round(time.monotonic() - start, 3),
                       bytes=missing["bytes"], files=missing["files"])
    except BaseException as exc:  # pylint: disable=broad-except  # every failure is reported, classified
        outcome.update(ok=False, **classify(exc, offline=os.environ.get("HF_HUB_OFFLINE") == "1"))
    return outcome


def main(argv: Sequence[str]) -> int:  # pragma: no cover - the entry point under the node runtime's python
    job_dir = argv[1]
    request = read_json(os.path.join(job_dir, REQUEST))
    outcome = download(job_dir, request)
    write_json(os.path.join(job_dir, OUTCOME), scrub(outcome, [os.environ.get("HF_TOKEN", "")]))
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
