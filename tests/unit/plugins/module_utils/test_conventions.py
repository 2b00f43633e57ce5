# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Conventions every plugin file keeps (docs/architecture.md, "Python conventions")."""

from __future__ import annotations

import ast
import os

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
