# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Model manifests: comparison, the hash cache's staleness rule, Hugging Face cache layouts, space."""

from __future__ import annotations

import hashlib
import os
import re

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._manifest import (
    ManifestError,
    build_manifest,
    cache_entry_fresh,
    check_manifest,
    compare_manifests,
    describe_diff,
    human_bytes,
    load_cache,
    save_cache,
    space_error,
    space_needed,
    stat_key,
    staging_plan,
    walk_model,
)
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import copy_tree


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


A, B, C = b"weights-a" * 100, b"weights-b" * 50, b"{}"
SOURCE = {"version": 1, "files": [
    {"path": "config.json", "size": len(C), "sha256": sha(C)},
    {"path": "model-00001.safetensors", "size": len(A), "sha256": sha(A)},
    {"path": "sub/model-00002.safetensors", "size": len(B), "sha256": sha(B)},
], "total_size": len(A) + len(B) + len(C)}


def node(**changes):
    """The source's files as a node holds them, with some replaced (None = absent)."""
    files = {e["path"]: dict(e) for e in SOURCE["files"]}
    for path, entry in changes.items():
        path = path.replace("__", "/")
        if entry is None:
            files.pop(path, None)
        else:
            files[path] = entry
    return {"files": list(files.values())}


# ---------------------------------------------------------------------------
# compare_manifests (pure)
# ---------------------------------------------------------------------------

COMPARE_CASES = [
    ("identical", node(), dict(missing=[], size_mismatch=[], hash_mismatch=[], extra=[], needed=[], bytes_needed=0)),
    ("empty-node", {"files": []}, dict(missing=[e["path"] for e in SOURCE["files"]], size_mismatch=[],
                                       hash_mismatch=[], extra=[], needed=[e["path"] for e in SOURCE["files"]],
                                       bytes_needed=SOURCE["total_size"])),
    ("missing-file", node(**{"model-00001.safetensors": None}),
     dict(missing=["model-00001.safetensors"], size_mismatch=[], hash_mismatch=[], extra=[],
          needed=["model-00001.safetensors"], bytes_needed=len(A))),
    ("size-mismatch", node(**{"sub__model-00002.safetensors": {"path": "sub/model-00002.safetensors", "size": 3,
                                                               "sha256": None}}),
     dict(missing=[], size_mismatch=["sub/model-00002.safetensors"], hash_mismatch=[], extra=[],
          needed=["sub/model-00002.safetensors"], bytes_needed=len(B))),
    ("hash-mismatch", node(**{"model-00001.safetensors": {"path": "model-00001.safetensors", "size": len(A),
                                                          "sha256": sha(b"corrupt")}}),
     dict(missing=[], size_mismatch=[], hash_mismatch=["model-00001.safetensors"], extra=[],
          needed=["model-00001.safetensors"], bytes_needed=len(A))),
    ("extra-file-on-node", node(**{"old.bin": {"path": "old.bin", "size": 1, "sha256": None}}),
     dict(missing=[], size_mismatch=[], hash_mismatch=[], extra=["old.bin"], needed=[], bytes_needed=0)),
    ("everything-at-once", node(**{"config.json": None, "model-00001.safetensors": {
        "path": "model-00001.safetensors", "size": len(A), "sha256": "0" * 64}, "zz.txt": {
        "path": "zz.txt", "size": 2, "sha256": None}}),
     dict(missing=["config.json"], size_mismatch=[], hash_mismatch=["model-00001.safetensors"], extra=["zz.txt"],
          needed=["config.json", "model-00001.safetensors"], bytes_needed=len(C) + len(A))),
]


@pytest.mark.parametrize("node_manifest, expected", [c[1:] for c in COMPARE_CASES], ids=[c[0] for c in COMPARE_CASES])
def test_compare_manifests(node_manifest, expected):
    diff = compare_manifests(SOURCE, node_manifest)
    assert diff == dict(expected, ok=not expected["needed"])


def test_describe_diff_names_each_file_and_why():
    diff = compare_manifests(SOURCE, node(**{"config.json": None, "model-00001.safetensors": {
        "path": "model-00001.safetensors", "size": len(A), "sha256": "0" * 64}}))
    assert describe_diff("spark2", diff) == (
        "spark2: 2 file(s), 902 B: config.json (missing), model-00001.safetensors (sha256 differs)")
    assert describe_diff("spark2", compare_manifests(SOURCE, node())) == "spark2: up to date"


BAD_MANIFESTS = [
    ("not-a-dict", [], "must be a dict with a 'files' list"),
    ("entry-without-hash", {"files": [{"path": "a", "size": 1}]}, "files[0] needs path, size and sha256"),
    ("absolute-path", {"files": [{"path": "/etc/passwd", "size": 1, "sha256": "x"}]}, "must be relative"),
    ("escapes-the-dir", {"files": [{"path": "../x", "size": 1, "sha256": "x"}]}, "must be relative"),
    ("not-normalised", {"files": [{"path": "a/../b", "size": 1, "sha256": "x"}]}, "must be relative"),
    ("duplicate", {"files": [{"path": "a", "size": 1, "sha256": "x"}, {"path": "a", "size": 1, "sha256": "x"}]},
     "unique"),
    ("null-hash", {"files": [{"path": "a", "size": 1, "sha256": None}]}, "(a) has no sha256"),
]


@pytest.mark.parametrize("manifest, message", [c[1:] for c in BAD_MANIFESTS], ids=[c[0] for c in BAD_MANIFESTS])
def test_check_manifest_rejects(manifest, message):
    with pytest.raises(ManifestError, match=re.escape(message)):
        check_manifest(manifest)


# ---------------------------------------------------------------------------
# build_manifest and the hash cache's staleness rule (real files)
# ---------------------------------------------------------------------------


def write_model(root, files=None):
    files = files or {"config.json": C, "model-00001.safetensors": A, "sub/model-00002.safetensors": B}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_build_manifest_matches_the_source_and_skips_partials(tmp_path):
    root = write_model(tmp_path / "m")
    (root / "model-00003.safetensors.partial").write_bytes(b"half")
    manifest, cache, counts = build_manifest(str(root))
    assert manifest == SOURCE
    assert counts == {"files": 3, "hashed": 3, "cached": 0}
    assert set(cache) == {"config.json", "model-00001.safetensors", "sub/model-00002.safetensors"}


def _rewrite_same_size(path):
    data = path.read_bytes()
    path.write_bytes(b"X" + data[1:])


def _rewrite_and_restore_mtime(path):
    st = os.stat(path)
    _rewrite_same_size(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replace_by_rename(path):
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, path)


def _touch(path):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))


STALENESS_CASES = [
    # (id, mutation of model-00001, hashed again?, hash changes?)
    ("unchanged", None, False, False),
    ("rewritten-same-size", _rewrite_same_size, True, True),
    ("rewritten-mtime-restored", _rewrite_and_restore_mtime, True, True),  # ctime catches it
    ("replaced-by-rename", _replace_by_rename, True, False),
    ("touched", _touch, True, False),
]


@pytest.mark.parametrize("mutate, rehashed, hash_changes", [c[1:] for c in STALENESS_CASES],
                         ids=[c[0] for c in STALENESS_CASES])
def test_stale_cache_entry_detection(tmp_path, mutate, rehashed, hash_changes):
    root = write_model(tmp_path / "m")
    first, cache, _counts = build_manifest(str(root))
    if mutate:
        mutate(root / "model-00001.safetensors")
    hashed = []

    def hasher(path):
        hashed.append(os.path.relpath(path, root))
        with open(path, "rb") as handle:
            return sha(handle.read())

    second, _cache, counts = build_manifest(str(root), cache, hasher=hasher)
    assert hashed == (["model-00001.safetensors"] if rehashed else [])
    assert counts["cached"] == 3 - len(hashed)
    changed = [a["path"] for a, b in zip(first["files"], second["files"]) if a["sha256"] != b["sha256"]]
    assert changed == (["model-00001.safetensors"] if hash_changes else [])


STAT_KEY = {"size": 10, "mtime_ns": 5, "ctime_ns": 6, "ino": 7}
FRESH_CASES = [
    ("same", dict(STAT_KEY, sha256="h"), True),
    ("no-entry", None, False),
    ("no-hash", dict(STAT_KEY, sha256=None), False),
    ("size", dict(STAT_KEY, size=11, sha256="h"), False),
    ("mtime", dict(STAT_KEY, mtime_ns=4, sha256="h"), False),
    ("ctime", dict(STAT_KEY, ctime_ns=9, sha256="h"), False),
    ("inode", dict(STAT_KEY, ino=8, sha256="h"), False),
]


@pytest.mark.parametrize("entry, fresh", [c[1:] for c in FRESH_CASES], ids=[c[0] for c in FRESH_CASES])
def test_cache_entry_fresh(entry, fresh):
    assert cache_entry_fresh(entry, STAT_KEY) is fresh


def test_build_manifest_hashes_only_what_the_comparison_needs(tmp_path):
    root = write_model(tmp_path / "m", {"a": b"1234", "b": b"12", "extra": b"x"})
    manifest, cache, counts = build_manifest(str(root), only=["a", "b"], expected_sizes={"a": 4, "b": 3})
    by_path = {e["path"]: e for e in manifest["files"]}
    assert by_path["a"]["sha256"] == sha(b"1234")
    assert by_path["b"]["sha256"] is None  # size differs from the source: re-sent without reading it
    assert by_path["extra"]["sha256"] is None
    assert counts["hashed"] == 1 and set(cache) == {"a"}


def test_cache_round_trip_is_per_directory(tmp_path):
    entries = {"a": dict(stat_key(os.stat(__file__)), sha256="h")}
    save_cache(str(tmp_path / "cache"), "/models/x", entries)
    assert load_cache(str(tmp_path / "cache"), "/models/x") == entries
    assert load_cache(str(tmp_path / "cache"), "/models/y") == {}
    assert load_cache(str(tmp_path / "nothing"), "/models/x") == {}


# ---------------------------------------------------------------------------
# Hugging Face cache layout: symlinks resolved to real files, dangling links refused
# (a fake layout; the hub itself cannot be reached from this machine)
# ---------------------------------------------------------------------------


def hf_layout(tmp_path, dangling=False):
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    (snapshot / "sub").mkdir(parents=True)
    for rel, data in {"config.json": C, "model-00001.safetensors": A, "sub/model-00002.safetensors": B}.items():
        (blobs / sha(data)).write_bytes(data)
        depth = "../" * (rel.count("/") + 2)
        os.symlink(depth + "blobs/" + sha(data), snapshot / rel)
    if dangling:
        os.symlink("../../blobs/" + "f" * 64, snapshot / "tokenizer.json")
    return snapshot, blobs


def test_hf_cache_symlinks_resolve_to_real_blobs(tmp_path):
    snapshot, blobs = hf_layout(tmp_path)
    files = walk_model(str(snapshot))
    assert files == {
        "config.json": str(blobs / sha(C)),
        "model-00001.safetensors": str(blobs / sha(A)),
        "sub/model-00002.safetensors": str(blobs / sha(B)),
    }
    assert build_manifest(str(snapshot))[0] == SOURCE


def test_hf_cache_dangling_link_is_refused_by_name(tmp_path):
    snapshot, _blobs = hf_layout(tmp_path, dangling=True)
    with pytest.raises(ManifestError, match=r"1 broken link\(s\).*tokenizer.json -> \.\./\.\./blobs/f{64}"):
        walk_model(str(snapshot))
    with pytest.raises(Exception, match="tokenizer.json"):
        copy_tree(str(snapshot), str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()  # nothing copied


@pytest.mark.parametrize("link", [True, False], ids=["hard-link", "copy"])
def test_hf_snapshot_materialises_as_real_files(tmp_path, link):
    snapshot, _blobs = hf_layout(tmp_path)
    dest = tmp_path / "model"
    assert copy_tree(str(snapshot), str(dest), link=link) == [
        "config.json", "model-00001.safetensors", "sub/model-00002.safetensors"]
    for rel in ("config.json", "model-00001.safetensors", "sub/model-00002.safetensors"):
        assert not os.path.islink(dest / rel) and os.path.isfile(dest / rel)
    assert build_manifest(str(dest))[0] == SOURCE
    assert copy_tree(str(snapshot), str(dest), link=link) == []  # idempotent


# ---------------------------------------------------------------------------
# Space and the cluster plan (pure)
# ---------------------------------------------------------------------------

SPACE_CASES = [
    ("fits", ["model-00001.safetensors"], {}, 10_000, 0, None),
    ("nothing-needed", [], {}, 0, 0, None),
    ("too-small", ["model-00001.safetensors"], {}, 100, 0,
     "spark2: not enough disk space for the model in /m: needs 900 B (900 bytes), 100 B free (100 bytes); "
     "free space there or choose another model_dir"),
    ("partial-counts", ["model-00001.safetensors"], {"model-00001.safetensors": 850}, 100, 0, None),
    ("oversized-partial-ignored", ["model-00001.safetensors"], {"model-00001.safetensors": 5000}, 100, 0, "needs 900 B"),
    ("reserve", ["config.json"], {}, 3, 2, "needs 2 B (2 bytes + 2 B reserve), 3 B free"),
]


@pytest.mark.parametrize("needed, partials, free, reserve, message", [c[1:] for c in SPACE_CASES],
                         ids=[c[0] for c in SPACE_CASES])
def test_space(needed, partials, free, reserve, message):
    need = space_needed(SOURCE, needed, partials)
    error = space_error("spark2", "/m", need, free, reserve)
    if message is None:
        assert error is None
    else:
        assert message in error


def test_human_bytes():
    assert [human_bytes(v) for v in (0, 1023, 1536, 5 * 1024**3)] == ["0 B", "1023 B", "1.5 KiB", "5.0 GiB"]


def _plan_result(host, node_manifest, space_err=None):
    diff = compare_manifests(SOURCE, node_manifest)
    return {"diff_files": diff, "summary": describe_diff(host, diff), "space": {"error": space_err}}


def test_staging_plan_lists_who_needs_what():
    plan = staging_plan(SOURCE, {
        "spark2": _plan_result("spark2", node(**{"config.json": None})),
        "spark3": _plan_result("spark3", node()),
        "spark4": _plan_result("spark4", {"files": []}, "spark4: not enough disk space ..."),
        "spark5": None,
    })
    assert plan["peers"] == ["spark2", "spark4"]
    assert [e["path"] for e in plan["needs"]["spark2"]] == ["config.json"]
    assert [e["path"] for e in plan["files"]] == [e["path"] for e in SOURCE["files"]]
    assert plan["bytes"] == len(C) + SOURCE["total_size"]
    assert plan["space_errors"] == ["spark4: not enough disk space ...", "spark5: no comparison result (task did not run)"]
    assert plan["lines"][1] == "spark3: up to date"
