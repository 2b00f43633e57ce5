#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: model_manifest
short_description: Compute (or reuse the cached) manifest of a model directory and compare it with the source's
version_added: 0.1.0
description:
  - Lists every file under O(path) with its relative path, size and sha256. Symlinks (a Hugging Face cache
    snapshot) are resolved to the real files; a dangling link fails the task naming it.
  - Hashes are cached on the host in O(cache_dir), one JSON file per model directory. A cached hash is reused
    only while the file's size, mtime_ns, ctime_ns and inode are unchanged, so an unchanged re-run stats every
    file and hashes none, and any write to a file (even one that restores its mtime, since ctime cannot be set)
    makes it be hashed again. O(rehash=true) ignores the cache.
  - With O(source_manifest) (the head's manifest), reports which files this host lacks or has wrong (missing,
    size differs, sha256 differs) and which extra files it has (reported, never deleted), and checks with
    C(statvfs) that the bytes still needed fit on the filesystem of O(path). The module never fails on a
    difference or on space; the role decides, so that every host's problem is reported at once.
  - Files ending in C(.partial) are an interrupted transfer's resume state, not part of the model.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Computes the same manifest and comparison; the hash cache is not written.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  path:
    description: The model directory on this host.
    type: path
    required: true
  host:
    description: This host's inventory name (used in messages).
    type: str
    required: true
  source_manifest:
    description: The source's manifest (the RV(manifest) this module returned on the head). Enables the comparison.
    type: dict
  allow_missing:
    description: A missing O(path) is an empty model (a worker that has nothing yet) instead of an error.
    type: bool
    default: false
  cache_dir:
    description: Directory of this host's hash cache.
    type: path
    default: /var/lib/multinode-vllm/manifest-cache
  rehash:
    description: Hash every file again, ignoring the cache.
    type: bool
    default: false
  reserve_bytes:
    description: Bytes that must stay free on the filesystem of O(path) after the copy.
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: Manifest of the model on the head
  multinode.vllm.model_manifest:
    path: /var/lib/multinode-vllm/models/llama
    host: "{{ inventory_hostname }}"
  register: head_manifest

- name: What each worker lacks, and whether it fits
  multinode.vllm.model_manifest:
    path: /var/lib/multinode-vllm/models/llama
    host: "{{ inventory_hostname }}"
    source_manifest: "{{ hostvars[groups['ray_head'][0]].head_manifest.manifest }}"
    allow_missing: true
  register: plan
"""

RETURN = r"""
manifest:
  description: "C(files) (C(path), C(size), C(sha256); C(sha256) is null for a file not hashed because it is not
    in the source or its size already differs), C(total_size), C(version)."
  returned: always
  type: dict
counts:
  description: C(files) listed, C(hashed) (read in full this run), C(cached) (hash reused from the cache).
  returned: always
  type: dict
diff_files:
  description: "C(ok), C(missing), C(size_mismatch), C(hash_mismatch), C(extra), C(needed) (files to send), C(bytes_needed)."
  returned: when source_manifest is given
  type: dict
space:
  description: "C(path) (the existing directory checked), C(needed) and C(free) bytes, and C(error) (null when it fits)."
  returned: when source_manifest is given
  type: dict
summary:
  description: One line, for example C(spark2 - 2 file(s), 4.0 MiB - a (missing), b (sha256 differs)).
  returned: when source_manifest is given
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._manifest import (
    ManifestError,
    build_manifest,
    check_manifest,
    compare_manifests,
    describe_diff,
    load_cache,
    save_cache,
    space_error,
    space_needed,
)
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import free_bytes, partial_sizes


def run(module: AnsibleModule) -> dict:
    p = module.params
    root = p["path"]
    source = p["source_manifest"]
    sizes = None
    only = None
    if source is not None:
        entries = check_manifest(source)
        sizes = {str(e["path"]): int(e["size"]) for e in entries}
        only = list(sizes)
    if not os.path.isdir(root) and p["allow_missing"]:
        manifest = {"version": 1, "files": [], "total_size": 0}
        counts = {"files": 0, "hashed": 0, "cached": 0}
    else:
        cache = {} if p["rehash"] else load_cache(p["cache_dir"], root)
        manifest, new_cache, counts = build_manifest(root, cache, rehash=p["rehash"], only=only,
                                                     expected_sizes=sizes)
        if not module.check_mode and new_cache != cache:
            save_cache(p["cache_dir"], root, new_cache)
    result = {"changed": False, "manifest": manifest, "counts": counts}
    if source is not None:
        diff = compare_manifests(source, manifest)
        needed = space_needed(source, diff["needed"], partial_sizes(root, diff["needed"]))
        checked, free = free_bytes(root)
        result["diff_files"] = diff
        result["space"] = {"path": checked, "needed": needed, "free": free,
                           "error": space_error(p["host"], root, needed, free, p["reserve_bytes"])}
        result["summary"] = describe_diff(p["host"], diff)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            host=dict(type="str", required=True),
            source_manifest=dict(type="dict"),
            allow_missing=dict(type="bool", default=False),
            cache_dir=dict(type="path", default="/var/lib/multinode-vllm/manifest-cache"),
            rehash=dict(type="bool", default=False),
            reserve_bytes=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except (ManifestError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (module.params["host"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
