# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared fixtures: host layouts and recorded command output, loaded from tests/unit/fixtures."""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Callable

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
