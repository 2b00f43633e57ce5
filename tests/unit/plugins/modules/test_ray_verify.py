# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""ray_verify's reader: how it reports a missing Ray, a changed private API, an unreachable GCS.

A real cluster is read in tests/integration/test_ray.py; here a stand-in
``ray`` package on PYTHONPATH causes the failures that cannot be caused
with the pinned Ray.
"""

from __future__ import annotations

import socket
import sys

import pytest

from ansible_collections.multinode.vllm.plugins.modules.ray_verify import ReadError, read_nodes

PY = [sys.executable]


def fake_ray(tmp_path, raylet_source):
    pkg = tmp_path / "ray"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '9.9.9'\n")
    (pkg / "_raylet.py").write_text(raylet_source)
    return {"PYTHONPATH": str(tmp_path)}


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield "127.0.0.1:%d" % sock.getsockname()[1]
    sock.close()


NODE = """
class Info:
    def __init__(self, addr, state):
        self.node_manager_address = addr
        self.state = state
        self.resources_total = {"GPU": 1.0}
        self.is_head_node = addr.endswith(".12")
class Id(bytes):
    pass
class GcsClient:
    def __init__(self, address):
        self.address = address
    def get_all_node_info(self, timeout=None):
        return {Id(b"\\x01"): Info("198.18.200.12", 0), Id(b"\\x02"): Info("198.18.200.13", 1)}
"""


def test_reads_the_node_table(tmp_path, listener):
    version, nodes, alive_seen = read_nodes(PY, listener, 5, fake_ray(tmp_path, NODE))
    assert version == "9.9.9"
    assert alive_seen == [1]  # no wait asked: one read
    assert nodes == [
        {"node_id": "01", "node_manager_address": "198.18.200.12", "alive": True, "resources": {"GPU": 1.0},
         "is_head": True},
        {"node_id": "02", "node_manager_address": "198.18.200.13", "alive": False, "resources": {"GPU": 1.0},
         "is_head": False},
    ]


def test_private_api_gone(tmp_path, listener):
    env = fake_ray(tmp_path, "class GcsClient:\n    def __init__(self, address):\n        pass\n")
    with pytest.raises(ReadError, match=r"Ray 9\.9\.9 has no GcsClient.get_all_node_info .*pin Ray 2\.60\.0"):
        read_nodes(PY, listener, 5, env)


def test_no_ray_importable(tmp_path, listener):
    env = {"PYTHONPATH": str(tmp_path)}  # no ray package there (nor in this interpreter)
    try:
        import ray  # noqa: F401  pylint: disable=unused-import
        pytest.skip("ray is importable in the test interpreter")
    except ImportError:
        pass
    with pytest.raises(ReadError, match="cannot import ray._raylet.GcsClient"):
        read_nodes(PY, listener, 5, env)


def test_nothing_listens(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % sock.getsockname()[1]
    sock.close()
    with pytest.raises(ReadError, match="nothing answers at GCS address 127.0.0.1"):
        read_nodes(PY, address, 2, fake_ray(tmp_path, NODE))


def test_interpreter_missing(listener):
    with pytest.raises(ReadError, match="not found"):
        read_nodes(["/nonexistent/python"], listener, 2, {})


def test_reader_raises(tmp_path, listener):
    env = fake_ray(tmp_path, "class GcsClient:\n    def __init__(self, address):\n        raise RuntimeError('boom')\n")
    with pytest.raises(ReadError, match="could not read Ray's node table .*RuntimeError: boom"):
        read_nodes(PY, listener, 2, env)


JOINING = """
import os
class Info:
    def __init__(self, addr, state):
        self.node_manager_address = addr
        self.state = state
        self.resources_total = {"GPU": 1.0}
class GcsClient:
    reads = 0
    def __init__(self, address):
        pass
    def get_all_node_info(self, timeout=None):
        GcsClient.reads += 1
        with open(os.environ["READS_FILE"], "w") as handle:
            handle.write(str(GcsClient.reads))
        # the worker registers on the third read
        worker = 0 if GcsClient.reads >= 3 else 1
        return {b"\\x01": Info("198.18.200.12", 0), b"\\x02": Info("198.18.200.13", worker)}
"""


def test_waits_for_the_nodes_in_one_reader_process(tmp_path, listener):
    env = dict(fake_ray(tmp_path, JOINING), READS_FILE=str(tmp_path / "reads"))
    version, nodes, alive_seen = read_nodes(PY, listener, 5, env, wait_for_nodes=2, wait_timeout=10)
    assert alive_seen == [1, 2]
    assert [n["alive"] for n in nodes] == [True, True]
    assert (tmp_path / "reads").read_text() == "3"  # one process read three times (a new process would count from 1)


def test_gives_up_waiting_at_the_deadline(tmp_path, listener):
    env = dict(fake_ray(tmp_path, JOINING.replace(">= 3", ">= 10**9")), READS_FILE=str(tmp_path / "reads"))
    version, nodes, alive_seen = read_nodes(PY, listener, 5, env, wait_for_nodes=2, wait_timeout=0.5)
    assert alive_seen == [1]
    assert [n["alive"] for n in nodes] == [True, False]
    assert 2 <= int((tmp_path / "reads").read_text()) <= 5  # polled every 0.2 s for 0.5 s


def test_a_failed_read_inside_the_wait_window_is_read_again(tmp_path, listener):
    flaky = JOINING.replace("        # the worker registers on the third read",
                            "        if GcsClient.reads <= 2:\n"
                            "            raise RuntimeError('GCS is not ready yet')\n"
                            "        # the worker registers on the third read")
    env = dict(fake_ray(tmp_path, flaky), READS_FILE=str(tmp_path / "reads"))
    version, nodes, alive_seen = read_nodes(PY, listener, 5, env, wait_for_nodes=2, wait_timeout=10)
    assert [n["alive"] for n in nodes] == [True, True] and alive_seen == [2]
    assert (tmp_path / "reads").read_text() == "3"
    # Without a wait window (or once it is over) the same failure is reported at once, as before.
    (tmp_path / "reads").unlink()
    with pytest.raises(ReadError, match="GCS is not ready yet"):
        read_nodes(PY, listener, 5, env)
