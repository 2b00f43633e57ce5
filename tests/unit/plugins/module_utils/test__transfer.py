# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model sender and puller over real loopback sockets: token, allow-list, resume, verification, stop."""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import (
    Sender,
    TransferError,
    bind_sender,
    pull_files,
    spawn_sender,
    stop_sender,
)

LO = "127.0.0.1"
TOKEN = "t0ken"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LO, 0))
        return sock.getsockname()[1]


@pytest.fixture
def model(tmp_path):
    root = tmp_path / "head"
    (root / "sub").mkdir(parents=True)
    (root / "a.safetensors").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (root / "sub" / "b.safetensors").write_bytes(os.urandom(100_000))
    (root / "config.json").write_bytes(b"{}")
    return root, build_manifest(str(root))[0]["files"]


@pytest.fixture
def sender(model, tmp_path):
    """A sender serving every file to 127.0.0.1, in a thread; yields (port, state_dir)."""
    root, entries = model
    port = free_port()
    server = Sender(str(root), [e["path"] for e in entries], TOKEN, {LO: "worker"}, lifetime=30)
    tcp, control = bind_sender(LO, port)
    state = tmp_path / "state"
    state.mkdir()
    thread = threading.Thread(target=server.serve, args=(tcp, control, str(state / ("sender-%d.json" % port))))
    thread.start()
    yield port, str(state), server
    stop_sender(port, None)
    thread.join(5)


def pull(port, dest, entries, token=TOKEN, **kwargs):
    return pull_files(LO, port, token, LO, "worker", str(dest), entries, connect_wait=0.5, fsync=False, **kwargs)


@pytest.mark.parametrize("streams", [1, 3])
def test_pull_everything_then_stop_reports_the_peer(model, sender, tmp_path, streams):
    root, entries = model
    port, state, _server = sender
    result = pull(port, tmp_path / "w", entries, streams=streams)
    assert [r["path"] for r in result["received"]] == [e["path"] for e in entries]
    assert result["local_address"] == LO and result["server"] == "%s:%d" % (LO, port)
    assert build_manifest(str(tmp_path / "w"))[0]["files"] == entries
    running, summary = stop_sender(port, state)
    assert summary["peers"] == [LO] and summary["bytes"] == sum(e["size"] for e in entries)
    assert summary["reason"] in ("every worker done", "stopped")
    with pytest.raises(OSError):  # nothing listens afterwards
        socket.create_connection((LO, port), timeout=1).close()


def test_resume_from_partial(model, sender, tmp_path):
    root, entries = model
    port, _state, _server = sender
    big = [e for e in entries if e["path"] == "a.safetensors"]
    dest = tmp_path / "w"
    dest.mkdir()
    (dest / "a.safetensors.partial").write_bytes((root / "a.safetensors").read_bytes()[:1_000_000])
    result = pull(port, dest, big)
    assert result["received"][0]["offset"] == 1_000_000
    assert result["bytes"] == big[0]["size"] - 1_000_000
    assert (dest / "a.safetensors").read_bytes() == (root / "a.safetensors").read_bytes()
    assert not (dest / "a.safetensors.partial").exists()


def test_corrupt_partial_is_detected_and_fetched_again_from_zero(model, sender, tmp_path):
    root, entries = model
    port, _state, _server = sender
    big = [e for e in entries if e["path"] == "a.safetensors"]
    dest = tmp_path / "w"
    dest.mkdir()
    (dest / "a.safetensors.partial").write_bytes(b"\0" * 1000)
    result = pull(port, dest, big)
    assert result["received"][0]["offset"] == 0
    assert hashlib.sha256((dest / "a.safetensors").read_bytes()).hexdigest() == big[0]["sha256"]


def test_wrong_content_never_replaces_the_file(model, sender, tmp_path):
    _root, entries = model
    port, _state, _server = sender
    wrong = [dict(entries[0], sha256="0" * 64)]
    with pytest.raises(TransferError, match="arrived with sha256 .* expected 0{64}"):
        pull(port, tmp_path / "w", wrong)
    assert not (tmp_path / "w" / wrong[0]["path"]).exists()


def test_wrong_token_is_refused_and_recorded(model, sender, tmp_path):
    _root, entries = model
    port, _state, server = sender
    with pytest.raises(TransferError, match="refused the connection: denied"):
        pull(port, tmp_path / "w", entries, token="guess")
    assert server.summary()["denied"] == [LO] and server.summary()["served"] == []


def test_unlisted_address_is_refused(model, tmp_path):
    root, entries = model
    port = free_port()
    server = Sender(str(root), [e["path"] for e in entries], TOKEN, {"198.18.200.13": "spark2"}, lifetime=30)
    tcp, control = bind_sender(LO, port)
    thread = threading.Thread(target=server.serve, args=(tcp, control))
    thread.start()
    try:
        with pytest.raises(TransferError, match="denied: 127.0.0.1 is not an expected worker fabric address"):
            pull(port, tmp_path / "w", entries)
    finally:
        stop_sender(port, None)
        thread.join(5)


def test_only_listed_files_are_served(model, tmp_path):
    root, entries = model
    port = free_port()
    server = Sender(str(root), ["config.json"], TOKEN, {LO: "worker"}, lifetime=30)
    tcp, control = bind_sender(LO, port)
    thread = threading.Thread(target=server.serve, args=(tcp, control))
    thread.start()
    try:
        with pytest.raises(TransferError, match="did not serve a.safetensors: not served"):
            pull(port, tmp_path / "w", [e for e in entries if e["path"] == "a.safetensors"])
    finally:
        stop_sender(port, None)
        thread.join(5)


def test_sender_refuses_files_it_does_not_have(model):
    root, _entries = model
    with pytest.raises(TransferError, match="cannot serve files missing from .*: nope.bin"):
        Sender(str(root), ["nope.bin"], TOKEN, {}, lifetime=1)


def test_address_not_carried():
    with pytest.raises(TransferError, match="this host does not carry 198.18.200.250"):
        bind_sender("198.18.200.250", free_port())


def test_spawned_sender_exits_when_every_worker_is_done(model, tmp_path):
    root, entries = model
    port = free_port()
    pid = spawn_sender(LO, port, str(root), [e["path"] for e in entries], TOKEN, {LO: "worker"}, 30,
                       str(tmp_path / "state"))
    assert pid > 0
    pull(port, tmp_path / "w", entries)
    running, summary = stop_sender(port, str(tmp_path / "state"))
    assert summary["reason"] == "every worker done" and summary["done"] == [LO]
    assert stop_sender(port, str(tmp_path / "state")) == (False, None)
