# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Conventions every plugin file keeps (docs/architecture.md, "Python conventions")."""

from __future__ import annotations

import ast
import os
import sys

import pytest

PLUGINS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "plugins"))
COLLECTION = "ansible_collections.multinode.vllm.plugins."


def _sources() -> list[str]:
    found = []
    for folder, _dirs, files in os.walk(PLUGINS):
        found += [os.path.join(folder, name) for name in files if name.endswith(".py")]
    return sorted(found)


def _tree(path: str) -> ast.Module:
    with open(path) as handle:
        return ast.parse(handle.read(), path)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: os.path.relpath(p, PLUGINS))
def test_the_collection_is_imported_by_its_absolute_name(path):
    """One import style: ``from ansible_collections.multinode.vllm.plugins.module_utils._x import y``, never ``from ._x``.

    Modules must name module_utils absolutely (Ansible's payload builder finds them by that name); module_utils do
    the same, so an import reads alike wherever it is.
    """
    relative = ["line %d: from %s%s import ..." % (node.lineno, "." * node.level, node.module or "")
                for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, relative


NODE_SCRIPTS = sorted(p for p in _sources() if os.path.basename(p).startswith("_node_"))


def test_the_node_scripts_are_found():
    names = [os.path.basename(p) for p in NODE_SCRIPTS]
    assert {"_node_ray_reader.py", "_node_rendezvous_rank.py", "_node_ray_placement.py", "_node_versions.py"} <= set(names)


@pytest.mark.parametrize("path", NODE_SCRIPTS, ids=os.path.basename)
def test_a_node_script_is_a_self_contained_program(path):
    """What runs under a node's interpreter as ``python -c <source>`` (``_scripts.script_argv``) has only its source.

    So: the standard library at import time (Ray, torch, vLLM imported inside functions, from the runtime), nothing
    of Ansible or of the collection anywhere, a ``main``, and an ``if __name__ == "__main__":`` that calls it.
    """
    tree = _tree(path)
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            top.add((node.module or "").split(".")[0])
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, sorted(top - set(sys.stdlib_module_names))
    anywhere = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    anywhere |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not anywhere & {"ansible", "ansible_collections"}, path
    assert any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body), path
    assert any(isinstance(node, ast.If) and "__main__" in ast.dump(node.test) for node in tree.body), path


def _dash_c_lists(tree: ast.AST) -> list[int]:
    """Lines of a list or tuple literal holding "-c" that is not a shell's ("sh", "/bin/sh" just before it)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for index, value in enumerate(values):
                if value == "-c" and not (index and values[index - 1] in ("sh", "/bin/sh", "bash")):
                    lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", _sources(), ids=lambda p: os.path.relpath(p, PLUGINS))
def test_python_runs_on_a_node_only_through_script_argv(path):
    """No plugin builds ``[python, "-c", <a string of code>]`` itself: the code is a node script, run by script_argv."""
    if os.path.basename(path) == "_scripts.py":
        return
    assert not _dash_c_lists(_tree(path)), path
