# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The versions of torch, vLLM and Ray in a node's runtime (a node script).

``distributed_preflight`` (``action: fingerprint``) runs this file's source under the runtime's interpreter
(``_scripts.script_argv``), to know what a rank would import without importing it (cheap: package metadata only).
It prints one JSON object, ``{"torch": "2.9.0", "vllm": ..., "ray": null}`` (null: not installed).

Self-contained (standard library only), as every node script is.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

PACKAGES = ("torch", "vllm", "ray")


def versions(names=PACKAGES) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except Exception:
            out[name] = None
    return out


def main() -> int:
    sys.stdout.write(json.dumps(versions()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    main()
