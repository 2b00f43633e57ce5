# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared fixtures: host layouts and recorded command output, loaded from tests/unit/fixtures."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from typing import Any, Callable, Iterator
from unittest import mock

import pytest
import yaml

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

_CACHE: dict[str, Any] = {}


def _load(name: str) -> Any:
    if name not in _CACHE:
        with open(os.path.join(FIXTURES, name)) as handle:
            _CACHE[name] = json.load(handle) if name.endswith(".json") else yaml.safe_load(handle)
    return copy.deepcopy(_CACHE[name])


@pytest.fixture
def fixture_data() -> Callable[[str], Any]:
    """``fixture_data("ip/spark1-addr.json")``: a fresh copy of a fixture file's data."""
    return _load


@pytest.fixture
def layout() -> Callable[..., dict[str, Any]]:
    """A host layout from networks.yml, with one or more entries changed.

    ``layout("spark1", enp1s0f1np1={"operstate": "down"})`` updates the
    interface (or RDMA HCA) of that name; an interface missing from the layout
    is added with the given fields.
    """

    def build(name: str, **changes: dict[str, Any]) -> dict[str, Any]:
        data = _load("networks.yml")[name]
        for target, fields in changes.items():
            entries = [e for e in data["interfaces"] if e["name"] == target]
            entries += [p for p in data["rdma"] if p["hca"] == target]
            if not entries:
                entry = {"name": target, "addresses": [], "mtu": 1500}
                data["interfaces"].append(entry)
                entries = [entry]
            for entry in entries:
                entry.update(fields)
        return data

    return build


def make_tree(root: str, files: dict[str, Any]) -> str:
    """Write a fake sysfs: each key a path under ``root``; a None value is a directory."""
    for rel, content in files.items():
        path = os.path.join(root, rel)
        if content is None:
            os.makedirs(path, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(str(content) + "\n")
    return root


@pytest.fixture
def sysfs_tree(tmp_path) -> Callable[[dict[str, Any]], str]:
    """Build a fake sysfs from a path->content mapping; returns its root."""
    return lambda files: make_tree(str(tmp_path / "sys"), files)


@pytest.fixture
def ip_runner() -> Callable[..., Callable[[list], str]]:
    """A stand-in for ``ip -j`` that answers from recorded output and logs the calls.

    ``ip_runner(addr=[...], route=[...])`` returns a runner; ``runner.calls``
    holds the argument lists it was given.
    """

    def build(addr: Any, route: Any) -> Callable[[list], str]:
        calls: list[list] = []

        def run(args: list) -> str:
            calls.append(list(args))
            if args == ["-4", "addr", "show"]:
                return json.dumps(addr)
            if args == ["-4", "route", "show", "default"]:
                return json.dumps(route)
            raise AssertionError("unexpected ip call: %r" % (args,))

        run.calls = calls  # type: ignore[attr-defined]
        return run

    return build


try:  # ansible-core >= 2.19
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # 2.17, 2.18: AnsibleModule reads its arguments from basic._ANSIBLE_ARGS when set

    @contextlib.contextmanager
    def patch_module_args(args: dict[str, Any] | None = None) -> Iterator[None]:
        from ansible.module_utils import basic

        with mock.patch.object(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode()):
            yield


@pytest.fixture
def run_main(monkeypatch, capsys) -> Callable[[Callable[[], None], dict[str, Any]], tuple[Any, dict[str, Any]]]:
    """``run_main(module.main, args)`` -> (exit code, result): a module's main() as Ansible runs it on a node.

    Works on every ansible-core that meta/runtime.yml supports (2.17 on), under plain pytest and ansible-test units.
    """
    try:
        from ansible.module_utils import _internal
    except ImportError:  # 2.17
        _internal = None
    if hasattr(_internal, "is_controller"):  # ansible-core >= 2.19
        # Importing controller code (the filter tests do, in the plain pytest run) flags this process as the
        # controller, and module warnings would then go to the display instead of the result; run as on a target.
        monkeypatch.setattr(_internal, "is_controller", False)

    def run(main: Callable[[], None], args: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        with patch_module_args(args), pytest.raises(SystemExit) as caught:
            main()
        return caught.value.code, json.loads(capsys.readouterr().out)

    return run
