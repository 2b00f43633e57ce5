# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a module runs Python on a node: the source of a node script, under the node's own interpreter.

A module runs in Ansible's Python; what needs the node's runtime (its venv or container, where Ray, torch, vLLM or
huggingface_hub are importable) runs as a node script: a ``_node_*.py`` file of module_utils that is a whole program
(standard library only at import time, a ``main``, ``if __name__ == "__main__"``). Ansible ships it to the node
inside the module's payload, like any module_utils the module imports; the module then runs

    <interpreter...> -c <the script's source> <arguments...>

where ``interpreter`` is the runtime's (``/opt/venv/bin/python``, ``docker exec <container> python``). The script
prints its result on stdout (one JSON object, or marked lines the module keeps the last of). docs/architecture.md,
"Python on a node", says why; tests/unit/plugins/module_utils/test_conventions.py checks every node script.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Sequence


def script_argv(interpreter: Sequence[str], script: ModuleType, *args: str) -> list[str]:
    """``interpreter -c <source of script> args...``: the command line that runs a node script."""
    return [*interpreter, "-c", inspect.getsource(script), *args]
