# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Model manifests: build one (with a hash cache), compare a node's copy to the source's, plan space.

A *manifest* is what every node must hold: ``{"files": [{"path", "size", "sha256"}], "total_size"}``,
paths relative to the model directory, sorted. It carries nothing node-specific, so the head's
manifest can be compared with any worker's.

A *hash cache* is node-local staleness data: ``{relpath: {"size", "mtime_ns", "ctime_ns", "ino",
"sha256"}}``. A cached hash is reused only while the file's (size, mtime_ns, ctime_ns, inode) are
unchanged; any write to the file (or a rename over it, or ``touch``) changes at least one of them,
so the file is rehashed. ``ctime`` cannot be set from user space, so even a write that restores the
old mtime is caught. An unchanged re-run therefore stats every file and hashes none.

Only ``build_manifest``/``hash_file``/``walk_model`` touch the filesystem (stat, read); the
comparison and planning functions are pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any, Callable, Iterable, Mapping, Optional

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

PARTIAL_SUFFIX = ".partial"
MANIFEST_VERSION = 1
HASH_CHUNK = 4 * 1024 * 1024


class ManifestError(MultinodeError):
    """The manifest cannot be built or used; the message says what, where, and what to do."""


def human_bytes(value: float) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, one decimal."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    size = float(value)
    for unit in units:
        if abs(size) < 1024 or unit == units[-1]:
            return ("%d %s" % (size, unit)) if unit == "B" else ("%.1f %s" % (size, unit))
        size /= 1024
    return "%d B" % value  # pragma: no cover


# ---------------------------------------------------------------------------
# Walking a model directory (resolving a Hugging Face cache layout's symlinks)
# ---------------------------------------------------------------------------


def walk_model(root: str, ignore_partial: bool = True) -> dict[str, str]:
    """Map every file under ``root`` to the real file that holds its bytes.

    Symlinks (a Hugging Face snapshot links every file to ``../../blobs/<hash>``) are resolved to
    the real file; the relative path stays the link's. A dangling link, or a link to something that
    is not a regular file, is an error naming it: it is never copied as a link. ``*.partial`` files
    (an interrupted transfer's resume state) are not part of the model.
    """
    if not os.path.isdir(root):
        raise ManifestError("model directory %s does not exist or is not a directory" % root)
    files: dict[str, str] = {}
    dangling: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if ignore_partial and name.endswith(PARTIAL_SUFFIX):
                continue
            real = os.path.realpath(full)
            try:
                st = os.stat(real)
            except FileNotFoundError:
                dangling.append("%s -> %s" % (rel, os.readlink(full) if os.path.islink(full) else real))
                continue
            if not stat.S_ISREG(st.st_mode):
                dangling.append("%s -> %s (not a regular file)" % (rel, real))
                continue
            files[rel] = real
        # os.walk lists a symlink to a missing directory as a file; a dangling dir link lands above.
    if dangling:
        raise ManifestError(
            "%s has %d broken link(s), which would be copied as dangling links: %s; "
            "re-download the model (a Hugging Face cache whose blobs were pruned?)"
            % (root, len(dangling), ", ".join(dangling[:10]) + (" ..." if len(dangling) > 10 else ""))
        )
    return files


def hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(HASH_CHUNK)
            if not chunk:
                break
            digest.update(chunk)
    return digest.hexdigest()


def stat_key(st: os.stat_result) -> dict[str, int]:
    """The staleness data of one file: any write, rename over it or touch changes one of these."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def cache_entry_fresh(entry: Optional[Mapping[str, Any]], key: Mapping[str, int]) -> bool:
    """True when a cached hash still describes the file whose stat key is ``key``."""
    if not entry or not entry.get("sha256"):
        return False
    return all(entry.get(field) == key[field] for field in ("size", "mtime_ns", "ctime_ns", "ino"))


def build_manifest(
    root: str,
    cache: Optional[Mapping[str, Mapping[str, Any]]] = None,
    rehash: bool = False,
    only: Optional[Iterable[str]] = None,
    expected_sizes: Optional[Mapping[str, int]] = None,
    hasher: Callable[[str], str] = hash_file,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """Manifest of ``root``, the refreshed hash cache, and counts (``files``, ``hashed``, ``cached``).

    ``only`` restricts hashing to those relative paths (other files are listed with their size and
    a null hash); ``expected_sizes`` skips hashing files whose size already differs from the
    source's (they must be re-sent anyway). ``rehash`` ignores the cache.
    """
    files = walk_model(root)
    old = cache or {}
    wanted = None if only is None else set(only)
    new_cache: dict[str, Any] = {}
    entries = []
    counts = {"files": 0, "hashed": 0, "cached": 0}
    for rel in sorted(files):
        st = os.stat(files[rel])
        key = stat_key(st)
        sha: Optional[str] = None
        skip = (wanted is not None and rel not in wanted) or (
            expected_sizes is not None and rel in expected_sizes and expected_sizes[rel] != st.st_size
        )
        if not skip:
            if not rehash and cache_entry_fresh(old.get(rel), key):
                sha = str(old[rel]["sha256"])
                counts["cached"] += 1
            else:
                sha = hasher(files[rel])
                counts["hashed"] += 1
            new_cache[rel] = dict(key, sha256=sha)
        counts["files"] += 1
        entries.append({"path": rel, "size": st.st_size, "sha256": sha})
    manifest = {"version": MANIFEST_VERSION, "files": entries, "total_size": sum(e["size"] for e in entries)}
    return manifest, new_cache, counts


def check_manifest(manifest: Any) -> list[dict[str, Any]]:
    """Validate a manifest's shape (it crosses hosts through Ansible); return its file entries."""
    if not isinstance(manifest, Mapping) or not isinstance(manifest.get("files"), list):
        raise ManifestError("the source manifest must be a dict with a 'files' list; got: %r" % (manifest,))
    seen = set()
    for index, entry in enumerate(manifest["files"]):
        if not isinstance(entry, Mapping) or not {"path", "size", "sha256"} <= set(entry):
            raise ManifestError("manifest files[%d] needs path, size and sha256; got: %r" % (index, entry))
        path = str(entry["path"])
        norm = os.path.normpath(path)
        if os.path.isabs(path) or norm.startswith("..") or norm != path or norm in seen:
            raise ManifestError("manifest files[%d] path must be relative, normalised and unique; got: %s"
                                % (index, path))
        if not entry["sha256"]:
            raise ManifestError("manifest files[%d] (%s) has no sha256" % (index, path))
        seen.add(norm)
    return list(manifest["files"])


def cache_file(cache_dir: str, root: str) -> str:
    """The node-local hash cache of model directory ``root`` (one JSON file per directory)."""
    name = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, "manifest-%s.json" % name)


def load_cache(cache_dir: str, root: str) -> dict[str, Any]:
    """The cached entries for ``root``; empty when absent, unreadable or for another directory."""
    try:
        with open(cache_file(cache_dir, root)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("root") != os.path.abspath(root):
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def save_cache(cache_dir: str, root: str, entries: Mapping[str, Any]) -> None:
    """Write the hash cache atomically (a reader sees the old or the new file, never half)."""
    os.makedirs(cache_dir, mode=0o755, exist_ok=True)
    path = cache_file(cache_dir, root)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        json.dump({"root": os.path.abspath(root), "entries": dict(entries)}, handle, sort_keys=True)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Comparing a node with the source (pure)
# ---------------------------------------------------------------------------


def compare_manifests(source: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """What a node lacks or has wrong, by file.

    Returns ``missing``, ``size_mismatch``, ``hash_mismatch`` (lists of paths), ``extra`` (files the
    node has that the source does not: reported, never deleted), ``needed`` (the files to send, in
    manifest order), ``bytes_needed`` and ``ok``.
    """
    theirs = {str(e["path"]): e for e in node.get("files", [])}
    missing, size_bad, hash_bad, needed = [], [], [], []
    bytes_needed = 0
    for entry in check_manifest(source):
        path = str(entry["path"])
        have = theirs.get(path)
        if have is None:
            missing.append(path)
        elif int(have["size"]) != int(entry["size"]):
            size_bad.append(path)
        elif have.get("sha256") != entry["sha256"]:
            hash_bad.append(path)
        else:
            continue
        needed.append(path)
        bytes_needed += int(entry["size"])
    wanted = {str(e["path"]) for e in source["files"]}
    extra = sorted(p for p in theirs if p not in wanted)
    return {
        "ok": not needed,
        "missing": missing,
        "size_mismatch": size_bad,
        "hash_mismatch": hash_bad,
        "extra": extra,
        "needed": needed,
        "bytes_needed": bytes_needed,
    }


def describe_diff(host: str, diff: Mapping[str, Any]) -> str:
    """One line for the play output: ``spark2: 2 file(s), 4.0 MiB: a (missing), b (sha256 differs)``."""
    if diff["ok"]:
        return "%s: up to date" % host
    reasons = {p: "missing" for p in diff["missing"]}
    reasons.update({p: "size differs" for p in diff["size_mismatch"]})
    reasons.update({p: "sha256 differs" for p in diff["hash_mismatch"]})
    return "%s: %d file(s), %s: %s" % (
        host, len(diff["needed"]), human_bytes(diff["bytes_needed"]),
        ", ".join("%s (%s)" % (p, reasons[p]) for p in diff["needed"]),
    )


def space_needed(source: Mapping[str, Any], needed: Iterable[str], partial_sizes: Mapping[str, int]) -> int:
    """Bytes a node must still write: each needed file's size less what its ``.partial`` already holds."""
    sizes = {str(e["path"]): int(e["size"]) for e in source["files"]}
    total = 0
    for path in needed:
        have = partial_sizes.get(path, 0)
        total += sizes[path] - have if 0 <= have <= sizes[path] else sizes[path]
    return total


def space_error(host: str, path: str, needed: int, free: int, reserve: int = 0) -> Optional[str]:
    """The message when ``needed`` (+ reserve) bytes do not fit in ``free``; None when they do."""
    if needed == 0 or needed + reserve <= free:
        return None
    return "%s: not enough disk space for the model in %s: needs %s (%d bytes%s), %s free (%d bytes); " \
        "free space there or choose another model_dir" % (
            host, path, human_bytes(needed), needed,
            (" + %s reserve" % human_bytes(reserve)) if reserve else "", human_bytes(free), free)


# ---------------------------------------------------------------------------
# The cluster's staging plan (pure; runs on the controller)
# ---------------------------------------------------------------------------


def staging_plan(source: Mapping[str, Any], plans: Mapping[str, Optional[Mapping[str, Any]]]) -> dict[str, Any]:
    """Who needs what, from each worker's ``model_manifest`` result (``diff_files``, ``space``, ``summary``).

    Returns ``needs`` (host -> the source entries to send it), ``files`` (the union the sender serves),
    ``peers`` (hosts that receive something), ``lines`` (one per host, for the play output),
    ``space_errors`` and ``bytes`` (total to send).
    """
    entries = {str(e["path"]): dict(e) for e in check_manifest(source)}
    needs: dict[str, list[dict[str, Any]]] = {}
    lines, errors = [], []
    union: set[str] = set()
    total = 0
    for host in sorted(plans):
        plan = plans[host]
        if not plan or "diff_files" not in plan:
            errors.append("%s: no comparison result (%s)" % (host, (plan or {}).get("msg", "task did not run")))
            continue
        needed = list(plan["diff_files"]["needed"])
        lines.append(str(plan.get("summary") or describe_diff(host, plan["diff_files"])))
        if plan.get("space", {}).get("error"):
            errors.append(str(plan["space"]["error"]))
        if needed:
            needs[host] = [entries[p] for p in needed]
            union.update(needed)
            total += sum(entries[p]["size"] for p in needed)
    return {
        "needs": needs,
        "files": [entries[p] for p in sorted(union)],
        "peers": sorted(needs),
        "lines": lines,
        "space_errors": errors,
        "bytes": total,
    }
