# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model sender and puller over real loopback sockets: token, allow-list, resume, verification, stop."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _transfer
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import (
    Sender,
    TransferError,
    bind_sender,
    pull_files,
    receive_stream,
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


# ---------------------------------------------------------------------------
# The pipelined receiver (receive_stream): hash and write in their own threads, in order
# ---------------------------------------------------------------------------


def _stream_into(tmp_path, payload, slot_size, slots, close_after=None):
    """Send ``payload`` (or its first ``close_after`` bytes, then close) through a socketpair into a file."""
    left, right = socket.socketpair()
    sent = payload if close_after is None else payload[:close_after]

    def send():
        with right:
            right.sendall(sent)

    thread = threading.Thread(target=send)
    thread.start()
    target = tmp_path / "out.bin"
    fd = os.open(str(target), os.O_WRONLY | os.O_CREAT, 0o644)
    digest = hashlib.sha256()
    try:
        with left:
            left.settimeout(10)
            got = receive_stream(left, fd, digest, len(payload), slot_size=slot_size, slots=slots)
    finally:
        os.close(fd)
        thread.join(10)
    return got, digest.hexdigest(), target.read_bytes()


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_receive_stream_writes_and_hashes_every_byte_in_order(tmp_path, slots):
    payload = os.urandom(10 * 1000 + 7)  # not a multiple of the slot size
    got, sha, written = _stream_into(tmp_path, payload, slot_size=1000, slots=slots)
    assert got == len(payload)
    assert written == payload
    assert sha == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize("slots", [1, 4])
def test_receive_stream_early_close_keeps_exactly_the_received_prefix(tmp_path, slots):
    payload = os.urandom(50_000)
    got, sha, written = _stream_into(tmp_path, payload, slot_size=4096, slots=slots, close_after=12_345)
    assert got == 12_345
    assert written == payload[:12_345]  # what a resume continues from
    assert sha == hashlib.sha256(payload[:12_345]).hexdigest()


def test_receive_stream_write_error_is_raised_not_hung(tmp_path):
    left, right = socket.socketpair()
    payload = os.urandom(64 * 1024)
    thread = threading.Thread(target=lambda: (right.sendall(payload), right.close()))
    thread.start()
    (tmp_path / "ro").write_bytes(b"")
    fd = os.open(str(tmp_path / "ro"), os.O_RDONLY)  # os.write fails with EBADF in the write stage
    try:
        with left, pytest.raises(OSError):
            left.settimeout(10)
            receive_stream(left, fd, hashlib.sha256(), len(payload), slot_size=4096, slots=4)
    finally:
        os.close(fd)
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize("slots", [1, 4])
def test_corrupted_byte_in_flight_is_refused_and_never_renamed(model, tmp_path, monkeypatch, slots):
    """A fake sender speaks the protocol but flips one byte mid-stream: the receiver's sha256 (one thread,
    or the pipeline) must differ from the manifest's, the file must not appear and the partial must be gone."""
    monkeypatch.setattr(_transfer, "RING_SLOTS", slots)
    root, entries = model
    entry = [e for e in entries if e["path"] == "a.safetensors"][0]
    data = bytearray((root / "a.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x01
    srv = socket.socket()
    srv.bind((LO, 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def fake_sender():
        conn, _addr = srv.accept()
        with conn, conn.makefile("rb") as reader:
            for line in reader:
                op = json.loads(line).get("op")
                if op == "get":
                    conn.sendall(json.dumps({"ok": True, "size": len(data)}).encode() + b"\n" + bytes(data))
                else:  # hello, done
                    conn.sendall(b'{"ok": true}\n')
                    if op == "done":
                        return

    thread = threading.Thread(target=fake_sender, daemon=True)
    thread.start()
    dest = tmp_path / "w"
    try:
        with pytest.raises(TransferError, match="a.safetensors arrived with sha256 [0-9a-f]{64}, expected %s"
                           % entry["sha256"]):
            pull(port, dest, [entry])
    finally:
        srv.close()
        thread.join(5)
    assert not (dest / "a.safetensors").exists()
    assert not (dest / "a.safetensors.partial").exists()


@pytest.mark.parametrize("slots", [1, 4])
def test_early_writeback_advises_each_written_chunk_and_keeps_every_byte(tmp_path, monkeypatch, slots):
    """With fsync on, writeback starts every WRITEBACK_CHUNK bytes (ranges contiguous from the start offset)."""
    from ansible_collections.multinode.vllm.plugins.module_utils import _transfer

    calls = []
    real = os.posix_fadvise
    monkeypatch.setattr(_transfer, "WRITEBACK_CHUNK", 4000)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, length, advice: (calls.append((off, length, advice)),
                                                                              real(fd, off, length, advice))[1])
    payload = os.urandom(10 * 1000 + 7)
    left, right = socket.socketpair()
    thread = threading.Thread(target=lambda: (right.sendall(payload), right.close()))
    thread.start()
    target = tmp_path / "out.bin"
    fd = os.open(str(target), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 100)  # a resumed file: the advice starts at the current offset
    try:
        with left:
            got = receive_stream(left, fd, hashlib.sha256(), len(payload), slot_size=1000, slots=slots,
                                 early_writeback=True)
    finally:
        os.close(fd)
        thread.join(10)
    assert got == len(payload) and target.read_bytes() == b"x" * 100 + payload
    assert [c[2] for c in calls] == [os.POSIX_FADV_DONTNEED] * len(calls) and len(calls) == 2
    assert calls[0][0] == 100 and calls[1][0] == calls[0][0] + calls[0][1]
    assert all(length >= 4000 for _off, length, _advice in calls)
