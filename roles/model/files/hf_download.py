# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Download a Hugging Face repo snapshot once (run on the head by the node runtime's python).

argv: repo_id revision cache_dir allow_patterns_json. HF_TOKEN (sourced from a 0600 file by the role) and
HF_HUB_OFFLINE come from the environment (huggingface_hub reads both). Prints one JSON line: the snapshot path (a cache layout:
symlinks into ../../blobs, resolved to real files by the next task) and whether it was already cached.
"""
import json
import os
import sys

from huggingface_hub import snapshot_download

repo_id, revision, cache_dir, patterns = sys.argv[1], sys.argv[2] or None, sys.argv[3] or None, json.loads(sys.argv[4])
kwargs = {"repo_id": repo_id, "revision": revision, "cache_dir": cache_dir, "allow_patterns": patterns or None}
try:
    path = snapshot_download(local_files_only=True, **kwargs)
    cached = True
except Exception:  # not (fully) in the cache yet: download it
    path = snapshot_download(**kwargs)
    cached = False
# "token": whether a token reached the process (from the sourced 0600 file), never the token itself.
print(json.dumps({"path": path, "cached": cached, "token": bool(os.environ.get("HF_TOKEN"))}))
