# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One error base: every exception class module_utils defines derives from MultinodeError."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from ansible_collections.multinode.vllm.plugins import module_utils
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError


def _defined_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.iter_modules(module_utils.__path__):
        if info.name.startswith("_node_"):
            # A node script is a whole program that imports nothing of the collection (test_conventions.py): its
            # exceptions are raised and handled inside it, and only its printed result reaches a module.
            continue
        module = importlib.import_module("%s.%s" % (module_utils.__name__, info.name))
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found["%s.%s" % (info.name, name)] = value
    return found


def test_every_error_derives_from_the_one_base():
    found = _defined_exceptions()
    assert "_fabric.FabricError" in found and "_serve.ServeError" in found, sorted(found)
    strays = sorted(name for name, cls in found.items() if cls is not MultinodeError and not issubclass(cls, MultinodeError))
    assert not strays, strays


def test_errors_caught_as_value_errors_stay_value_errors():
    found = _defined_exceptions()
    for name in ("_bind_audit.AuditError", "_secrets.SecretError", "_detach.LineTooLong", "_cluster.ClusterError"):
        assert issubclass(found[name], ValueError) and issubclass(found[name], MultinodeError), name
