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
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _transfer
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import (
    Sender,
    TransferError,
    bind_sender,
    copy_tree,
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
    # The sender exits by itself, writing its summary, once the puller's last connection is closed: wait for that
    # (bounded) rather than race it with a QUIT, which would stop it with the reason "stopped" on a loaded machine.
    summary_path = _transfer.state_file(str(tmp_path / "state"), port)
    deadline = time.monotonic() + 20
    while not os.path.exists(summary_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    _running, summary = stop_sender(port, str(tmp_path / "state"))
    assert summary is not None, "no summary 20 s after every worker said done"
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


# ---------------------------------------------------------------------------
# Before the token: what another host on the fabric can do to the sender (docs/security.md)
# ---------------------------------------------------------------------------

STRANGER = "127.0.0.5"  # loopback too, but no expected worker's address


def _status(pid, field):
    """A field of /proc/<pid>/status as an int (VmHWM in KiB, Threads)."""
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def _closed_within(conn, seconds):
    conn.settimeout(seconds)
    try:
        while conn.recv(4096):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def _answer(conn, seconds=2.0):
    """The sender's next answer line, without sending anything first."""
    conn.settimeout(seconds)
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            break
        line += chunk
    return json.loads(line) if line else None


def _answer_or_none(conn, seconds):
    try:
        return _answer(conn, seconds)
    except socket.timeout:
        return None


@pytest.fixture
def spawned(model, tmp_path):
    """spawn(peers) -> (port, pid): a real detached sender, as the module starts it; stopped after."""
    root, entries = model
    ports = []

    def spawn(peers):
        port = free_port()
        ports.append(port)
        return port, spawn_sender(LO, port, str(root), [e["path"] for e in entries], TOKEN, peers, 60,
                                  str(tmp_path / "state"))

    yield spawn
    for port in ports:
        stop_sender(port, None)


def test_a_stranger_is_denied_before_it_sends_a_byte(model, tmp_path):
    """The address is judged on accept: the denial comes before any hello, and strangers cost no thread."""
    root, entries = model
    port = free_port()
    server = Sender(str(root), [e["path"] for e in entries], TOKEN, {LO: "worker"}, lifetime=30)
    tcp, control = bind_sender(LO, port)
    thread = threading.Thread(target=server.serve, args=(tcp, control))
    thread.start()
    try:
        threads = threading.active_count()
        strangers = [socket.create_connection((LO, port), timeout=2, source_address=(STRANGER, 0))
                     for _conn in range(50)]
        answers = [_answer(conn) for conn in strangers]
        assert threading.active_count() == threads
        assert answers == [{"ok": False, "error": "denied: %s is not an expected worker fabric address" % STRANGER}] * 50
        for conn in strangers:
            conn.close()
        assert server.summary()["denied"] == [STRANGER]
        pull(port, tmp_path / "w", entries)  # the worker still pulls
    finally:
        stop_sender(port, None)
        thread.join(5)


def test_a_hello_without_newline_is_cut_off_and_memory_stays_bounded(spawned):
    """64 MiB without a newline from a worker's own address: cut off at the hello bound, the sender stays small."""
    port, pid = spawned({LO: "worker"})
    time.sleep(0.2)
    before = _status(pid, "VmHWM")
    sent = 0
    chunk = b"x" * (1024 * 1024)
    with socket.create_connection((LO, port), timeout=5.0) as conn:
        try:
            for _chunk in range(64):
                conn.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # reset: the sender closed the connection after the bound
        grown = _status(pid, "VmHWM") - before
    assert sent < 64 * 1024 * 1024, "the sender took 64 MiB without a newline"
    assert grown < 8 * 1024, "the sender grew by %d KiB" % grown


def test_idle_connections_beyond_the_cap_are_refused_and_a_worker_still_pulls(spawned, model, tmp_path, monkeypatch):
    """60 idle connections from one worker's address: the cap's worth get a thread, the rest a "busy" answer; the
    admitted ones are cut off at the hello timeout; the other worker pulls meanwhile."""
    _root, entries = model
    monkeypatch.setattr(_transfer, "HELLO_SECONDS", 1.0)  # read by the forked sender
    cap = _transfer.PER_PEER_CONNECTIONS
    port, pid = spawned({LO: "worker", "127.0.0.3": "idler"})
    baseline = _status(pid, "Threads")
    idle = [socket.create_connection((LO, port), timeout=3.0, source_address=("127.0.0.3", 0)) for _conn in range(60)]
    try:
        time.sleep(0.3)
        assert _status(pid, "Threads") <= baseline + cap
        busy = [answer for answer in (_answer_or_none(conn, 0.2) for conn in idle) if answer]
        assert len(busy) == 60 - cap
        assert busy[0]["error"] == ("busy: 127.0.0.3 already holds %d connections to the sender (its limit); "
                                    "use model_transfer_streams %d or fewer" % (cap, _transfer.MAX_STREAMS))
        pull(port, tmp_path / "w", entries, streams=2)
        assert build_manifest(str(tmp_path / "w"))[0]["files"] == entries
        assert all(_closed_within(conn, 3.0) for conn in idle)  # the admitted idle ones, at the hello timeout
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.parametrize("hello", [
    b"[]", b"\xff\xfe", b"null", b'"token"', b'{"token": ["t0ken"]}', b'{"token": 7}', b"[" * 2000 + b"]" * 2000,
])
def test_a_bad_hello_is_answered_and_never_reaches_the_thread_excepthook(sender, hello, monkeypatch, tmp_path, model):
    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    port, _state, server = sender
    with socket.create_connection((LO, port), timeout=2) as conn:
        conn.sendall(hello + b"\n")
        answer = _answer(conn)
    assert answer == {"ok": False, "error": "denied: 127.0.0.1 did not present this run's token (a puller from "
                                            "another run?); run the play again"}
    assert raised == []
    pull(port, tmp_path / "w", model[1])


@pytest.mark.parametrize("request_line, error", [
    (b"[]", "not served: None"),
    (b"\xff", "not served: None"),
    (b'{"op": "get", "path": ["a"]}', "not served: ['a']"),
    (b'{"op": "get", "path": "config.json", "offset": "x"}', "bad offset for config.json: 'x'"),
])
def test_a_bad_request_after_the_hello_is_answered(sender, request_line, error, monkeypatch):
    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    port, _state, _server = sender
    with socket.create_connection((LO, port), timeout=2) as conn:
        conn.sendall(json.dumps({"op": "hello", "token": TOKEN}).encode() + b"\n")
        assert _answer(conn) == {"ok": True}
        conn.sendall(request_line + b"\n")
        assert _answer(conn) == {"ok": False, "error": error}
    assert raised == []


def test_one_stream_saying_done_does_not_end_the_sender_while_another_is_open(sender):
    """A puller's first stream says done while its second still works: the sender ends only after both."""
    port, _state, server = sender
    hello = json.dumps({"op": "hello", "token": TOKEN}).encode() + b"\n"
    second = socket.create_connection((LO, port), timeout=2)
    second.sendall(hello)
    assert _answer(second) == {"ok": True}
    with socket.create_connection((LO, port), timeout=2) as first:
        first.sendall(hello + b'{"op": "done"}\n')
        assert _answer(first) == {"ok": True} and _answer(first) == {"ok": True}
    time.sleep(0.5)
    assert not server.stop.is_set(), "the sender stopped while a stream of the worker was still open"
    second.sendall(b'{"op": "done"}\n')
    assert _answer(second) == {"ok": True}
    second.close()
    assert server.stop.wait(2) and server.summary()["reason"] == "every worker done"


# ---------------------------------------------------------------------------
# The puller's files: only its own regular .partial, under the model root, one puller at a time
# ---------------------------------------------------------------------------


def test_a_symlink_at_the_partial_is_refused_and_its_target_untouched(model, sender, tmp_path):
    _root, entries = model
    port, _state, _server = sender
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "w"
    dest.mkdir()
    (dest / "a.safetensors.partial").symlink_to(victim)
    (dest / "config.json.partial").symlink_to(tmp_path / "created-through-a-dangling-link")
    for path, target in [("a.safetensors", victim), ("config.json", tmp_path / "created-through-a-dangling-link")]:
        with pytest.raises(TransferError, match=r"^worker: %s\.partial is a symlink to %s, not a regular file of its "
                           r"own; .*remove it .*then run again" % (dest / path, target)):
            pull(port, dest, [e for e in entries if e["path"] == path])
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "created-through-a-dangling-link").exists()
    assert (dest / "a.safetensors.partial").is_symlink() and not (dest / "a.safetensors").exists()


def test_a_hard_link_or_fifo_at_the_partial_is_refused(model, sender, tmp_path):
    _root, entries = model
    port, _state, _server = sender
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "w"
    dest.mkdir()
    os.link(victim, dest / "a.safetensors.partial")
    os.mkfifo(dest / "config.json.partial")
    with pytest.raises(TransferError, match=r"a.safetensors\.partial is a file with 2 hard links, not a regular file "
                                            r"of its own"):
        pull(port, dest, [e for e in entries if e["path"] == "a.safetensors"])
    with pytest.raises(TransferError, match=r"config.json\.partial is a FIFO, not a regular file of its own"):
        pull(port, dest, [e for e in entries if e["path"] == "config.json"])
    assert victim.read_bytes() == b"precious"


def test_a_symlinked_directory_below_the_root_is_refused(model, sender, tmp_path):
    """The file's real path stays under the model root: sub/ planted as a link to elsewhere is not followed."""
    _root, entries = model
    port, _state, _server = sender
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "w"
    dest.mkdir()
    (dest / "sub").symlink_to(elsewhere)
    with pytest.raises(TransferError, match=r"^worker: %s is a symlink to %s, not a directory; the model's files are "
                       r"written only into real directories under %s: remove it and run again"
                       % (dest / "sub", elsewhere, dest)):
        pull(port, dest, [e for e in entries if e["path"] == "sub/b.safetensors"])
    assert os.listdir(elsewhere) == []


def test_a_model_root_that_is_itself_a_link_is_followed(model, sender, tmp_path):
    """model_dir is the user's choice: a link there (to a data disk) is fine."""
    _root, entries = model
    port, _state, _server = sender
    (tmp_path / "disk").mkdir()
    (tmp_path / "w").symlink_to(tmp_path / "disk")
    pull(port, tmp_path / "w", entries)
    assert build_manifest(str(tmp_path / "disk"))[0]["files"] == entries


class _StallingSender:
    """Speaks the protocol on real loopback sockets, but sends only the first ``stall_at`` bytes of a file in
    ``stall`` until ``release`` is set (or ``hold`` seconds pass); a path in ``refuse`` is not served."""

    def __init__(self, data, stall=(), refuse=(), stall_at=1024 * 1024, hold=10.0):
        self.data, self.stall, self.refuse, self.stall_at, self.hold = data, stall, refuse, stall_at, hold
        self.release = threading.Event()
        self.srv = socket.create_server((LO, 0))
        self.port = self.srv.getsockname()[1]
        self.threads = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn = self.srv.accept()[0]
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, conn):
        try:
            with conn, conn.makefile("rb") as reader:
                for line in reader:
                    request = json.loads(line)
                    path = request.get("path")
                    if request["op"] != "get":
                        conn.sendall(b'{"ok": true}\n')
                        continue
                    if path in self.refuse:
                        conn.sendall(json.dumps({"ok": False, "error": "not served: %s" % path}).encode() + b"\n")
                        return
                    data = self.data[path][request.get("offset", 0):]
                    conn.sendall(json.dumps({"ok": True, "size": len(self.data[path])}).encode() + b"\n")
                    if path in self.stall:
                        conn.sendall(data[:self.stall_at])
                        self.release.wait(self.hold)
                        data = data[self.stall_at:]
                    conn.sendall(data)
        except OSError:
            pass

    def close(self):
        self.release.set()
        self.srv.close()
        for thread in self.threads:
            thread.join(5)


def test_two_pullers_on_one_partial_the_second_is_refused(model, tmp_path):
    """The first puller holds the partial's lock while it receives; the second into the same directory (a shared
    model_dir) is refused, naming the file, and the first completes intact."""
    root, entries = model
    entry = [e for e in entries if e["path"] == "a.safetensors"][0]
    fake = _StallingSender({"a.safetensors": (root / "a.safetensors").read_bytes()}, stall=["a.safetensors"])
    dest = tmp_path / "shared"
    first = {}
    thread = threading.Thread(target=lambda: first.update(pull(fake.port, dest, [entry], timeout=20)))
    try:
        thread.start()
        deadline = time.monotonic() + 5
        while not (dest / "a.safetensors.partial").exists() or (dest / "a.safetensors.partial").stat().st_size == 0:
            assert time.monotonic() < deadline, "the first puller never started"
            time.sleep(0.02)
        with pytest.raises(TransferError, match=r"^worker: %s\.partial is being written by another puller \(two hosts "
                           r"or runs pulling into one shared model directory\?\); let one host pull into a shared "
                           r"model_dir, or wait for the other pull to end and run again" % (dest / "a.safetensors")):
            pull(fake.port, dest, [entry], timeout=2)
        fake.release.set()
        thread.join(10)
    finally:
        fake.close()
    assert first["received"][0]["path"] == "a.safetensors"
    assert hashlib.sha256((dest / "a.safetensors").read_bytes()).hexdigest() == entry["sha256"]


def test_a_stalled_transfer_names_the_file_the_timeout_and_the_resume(model, tmp_path):
    root, entries = model
    entry = [e for e in entries if e["path"] == "a.safetensors"][0]
    fake = _StallingSender({"a.safetensors": (root / "a.safetensors").read_bytes()}, stall=["a.safetensors"],
                           stall_at=1000)
    dest = tmp_path / "w"
    try:
        with pytest.raises(TransferError, match=r"^worker: receiving %s from the sender at 127.0.0.1:%d stalled for "
                           r"0.5 s \(model_transfer_timeout\), 1000 bytes kept in %s\.partial; run again to resume$"
                           % (dest / "a.safetensors", fake.port, dest / "a.safetensors")):
            pull(fake.port, dest, [entry], timeout=0.5)
    finally:
        fake.close()


def test_one_failed_stream_stops_the_other(model, tmp_path):
    """Stream 1 stalls mid-file, stream 2 is refused a file: the pull fails at once with stream 2's error
    instead of waiting for stream 1 (held 10 s here, until model_transfer_timeout in life)."""
    root, entries = model
    data = {e["path"]: (root / e["path"]).read_bytes() for e in entries}
    big = [e for e in entries if e["path"] == "a.safetensors"][0]
    small = [e for e in entries if e["path"] == "config.json"][0]
    fake = _StallingSender(data, stall=["a.safetensors"], refuse=["config.json"], hold=10.0)
    started = time.monotonic()
    try:
        with pytest.raises(TransferError, match=r"^worker: the sender did not serve config.json: not served"):
            pull(fake.port, tmp_path / "w", [big, small], streams=2, timeout=30)
        assert time.monotonic() - started < 5, "the failed stream did not stop the stalled one"
    finally:
        fake.close()
    assert (tmp_path / "w" / "a.safetensors.partial").exists()  # kept for the resume


def test_streams_beyond_the_sender_cap_are_refused_by_name(model, sender, tmp_path):
    _root, entries = model
    port, _state, _server = sender
    with pytest.raises(TransferError, match=r"^worker: model_transfer_streams is 17; the sender admits 1 to 16 "
                                            r"connections per worker: set it within that range$"):
        pull(port, tmp_path / "w", entries, streams=17)


def test_copy_tree_never_writes_through_a_dangling_link_at_the_partial(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_bytes(b"{}")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json.partial").symlink_to(tmp_path / "elsewhere")
    assert copy_tree(str(src), str(dest), link=False) == ["config.json"]
    assert not (tmp_path / "elsewhere").exists()
    assert (dest / "config.json").read_bytes() == b"{}" and not (dest / "config.json").is_symlink()


# ---------------------------------------------------------------------------
# Progress of a running pull, measured from the disk by another process (model_transfer job=status)
# ---------------------------------------------------------------------------


def test_pull_progress_counts_renamed_files_whole_and_partials_by_their_bytes(tmp_path):
    from ansible_collections.multinode.vllm.plugins.module_utils._transfer import final_inodes, pull_progress

    root = tmp_path / "w"
    (root / "sub").mkdir(parents=True)
    entries = [{"path": "a.safetensors", "size": 1000}, {"path": "sub/b.safetensors", "size": 500},
               {"path": "c.json", "size": 10}, {"path": "d.bin", "size": 300}]
    # Before the pull: a wrong copy of a (to be replaced), a partial of b left by an interrupted run.
    (root / "a.safetensors").write_bytes(b"x" * 1000)
    (root / "sub" / "b.safetensors.partial").write_bytes(b"y" * 200)
    inodes = final_inodes(str(root), [e["path"] for e in entries])
    assert inodes["c.json"] == 0 and inodes["a.safetensors"] == os.lstat(root / "a.safetensors").st_ino
    # The wrong copy of a is not counted: same inode as when the pull started.
    assert pull_progress(str(root), entries, inodes) == {
        "bytes_done": 200, "bytes_total": 1810, "files_done": 0, "files_total": 4}
    # b resumes and grows, c arrives (renamed into place from its own partial), a is replaced.
    (root / "sub" / "b.safetensors.partial").write_bytes(b"y" * 450)
    (root / "c.json.partial").write_bytes(b"{}" * 5)
    os.replace(root / "c.json.partial", root / "c.json")
    (root / "a.safetensors.partial").write_bytes(b"z" * 1000)
    os.replace(root / "a.safetensors.partial", root / "a.safetensors")
    assert pull_progress(str(root), entries, inodes) == {
        "bytes_done": 1460, "bytes_total": 1810, "files_done": 2, "files_total": 4}
    # A partial longer than the manifest says (a changed file on the head) counts no more than the file.
    (root / "d.bin.partial").write_bytes(b"w" * 999)
    assert pull_progress(str(root), entries, inodes)["bytes_done"] == 1760
    # A link planted at a partial is not the puller's: not counted.
    os.unlink(root / "d.bin.partial")
    os.symlink("/etc/hostname", str(root / "d.bin.partial"))
    assert pull_progress(str(root), entries, inodes)["bytes_done"] == 1460
