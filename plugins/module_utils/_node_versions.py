# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The versions of a node's runtime (a node script).

``distributed_preflight`` (``action: fingerprint``) runs this file's source under the runtime's interpreter
(``_scripts.script_argv``), to know what a rank would import without importing it (cheap: package metadata only).
It prints one JSON object, ``{"torch": "2.9.0", "vllm": ..., "ray": null}`` (null: not installed).

With the argument ``stack`` (``stack_facts``, the stack fingerprint gate) it prints the whole stack instead:
those three and ``python``, ``nccl`` (the NCCL torch would load: a pip ``nvidia-nccl-*`` distribution, else a system
``libnccl.so.*``), ``cuda_runtime`` (the pip CUDA runtime) and ``driver`` (the NVIDIA kernel driver). Still cheap:
package metadata, a directory listing and one file of /proc; torch is never imported.

Self-contained (standard library only), as every node script is.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import re
import sys

PACKAGES = ("torch", "vllm", "ray")
# The pip distributions torch loads NCCL and the CUDA runtime from, in the order they are looked for.
NCCL_DISTS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl")
CUDA_RUNTIME_DISTS = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")
# Where a system NCCL lives (Debian/Ubuntu multiarch, the CUDA toolkit, RHEL).
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64")
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"


def versions(names=PACKAGES) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except Exception:
            out[name] = None
    return out


def _first_dist(names):
    """``pip <name> <version>`` of the first installed distribution of ``names``; None when none is."""
    for name in names:
        try:
            return "pip %s %s" % (name, importlib.metadata.version(name))
        except Exception:
            continue
    return None


def _version_key(version):
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def system_nccl(lib_dirs=LIB_DIRS):
    """``system libnccl 2.21.5`` from the most precise ``libnccl.so.<version>`` file name found; None when none."""
    found = []
    for directory in lib_dirs:
        for path in glob.glob(os.path.join(directory, "libnccl.so.*")):
            version = os.path.basename(path)[len("libnccl.so."):]
            if version:
                found.append(version)
    if not found:
        return None
    return "system libnccl %s" % max(found, key=lambda v: (len(v.split(".")), _version_key(v)))


def driver_version(path=DRIVER_VERSION_FILE):
    """The NVIDIA kernel driver's version (``580.95.05``) from /proc; None without the driver."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    match = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)\s", text)
    return match.group(1) if match else None


def stack(lib_dirs=LIB_DIRS, driver_file=DRIVER_VERSION_FILE) -> dict:
    """The whole stack: versions() and python, nccl, cuda_runtime, driver (null: not installed)."""
    out = {"python": "%d.%d.%d" % tuple(sys.version_info[:3])}
    out.update(versions())
    out["nccl"] = _first_dist(NCCL_DISTS) or system_nccl(lib_dirs)
    out["cuda_runtime"] = _first_dist(CUDA_RUNTIME_DISTS)
    out["driver"] = driver_version(driver_file)
    return out


def main() -> int:
    result = stack() if sys.argv[1:2] == ["stack"] else versions()
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    main()
