# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Model transfer over the fabric: a short-lived sender on the head, a puller on each worker.

Standard library only. The sender follows the fabric probe's pattern (``_probe.spawn_listener``):
it binds in the calling process (so a bad address or a taken port fails the task at once), then
serves from a detached grandchild that is stopped through an abstract unix control socket private
to the node's network namespace, and that exits by itself when every expected worker said DONE or
its lifetime ends. Nothing listens after the stop task.

Protocol (one JSON line per request, one per answer; file bytes follow an ``ok`` answer raw):

* on connect, before reading anything: a peer address that is not an expected worker's fabric address,
  or one that already holds ``PER_PEER_CONNECTIONS``, gets ``{"ok": false, "error": "denied: ..."}`` (or
  ``"busy: ..."``) and the connection is closed;
* ``{"op": "hello", "token": T, "host": H}`` (at most ``HELLO_LIMIT`` bytes, within ``HELLO_SECONDS``)
  -> ``{"ok": true}``, or ``{"ok": false, "error": ...}`` and the connection is closed (not this run's token);
* ``{"op": "get", "path": P, "offset": N}`` -> ``{"ok": true, "size": S}`` then ``S - N`` bytes
  (only paths listed when the sender was started are served);
* ``{"op": "done"}`` -> ``{"ok": true}``.

The token is random per run, lives only in the sender's memory and the tasks' (no_log) arguments.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import select
import shutil
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._detach import (
    ConnectionGate,
    LineReader,
    bind_replacing,
    listen_error,
    refuse,
    run_detached,
)
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import (
    PARTIAL_SUFFIX,
    ManifestError,
    stat_key,
    walk_model,
)

RECV_BUFFER = 4 * 1024 * 1024
# The receiver (docs/model-staging.md, "Throughput"; tests/bench/bench_transfer_local.py). 1 MiB slots: 4 MiB
# slots make a 16 MiB ring that leaves the caches (hashing and writing re-read memory; measured slower).
# The pipeline (hash and write in their own threads) costs more CPU per byte than one thread (cross-core
# hand-offs); on 2 cores shared with the sender it measured no faster, so it is used only where cores are
# spare. RING_SLOTS < 2: receive, hash and write in one thread.
SLOT_SIZE = 1024 * 1024
RING_SLOTS = 4 if len(os.sched_getaffinity(0)) >= 4 else 1


class TransferError(MultinodeError):
    """A transfer step failed; the message names the host, the file or address, and the fix."""


def control_address(port: int) -> str:
    """Abstract unix socket of the sender on ``port`` (per network namespace, like the probe's)."""
    return "\0multinode-vllm-model-sender-%d" % port


def state_file(state_dir: str, port: int) -> str:
    return os.path.join(state_dir, "sender-%d.json" % port)


# ---------------------------------------------------------------------------
# Sender (head)
# ---------------------------------------------------------------------------


def _send_json(conn: socket.socket, data: Mapping[str, Any]) -> None:
    conn.sendall(json.dumps(data).encode() + b"\n")


# What a peer may send before and after the token is checked (tests/unit/.../test__transfer.py, "Before the token").
# A hello is a token and a host name: 4 KiB, within 10 s. A request names one manifest path.
HELLO_LIMIT = 4096
HELLO_SECONDS = 10.0
REQUEST_LIMIT = 16384
REQUEST_SECONDS = 60.0  # a puller hashes a resumed partial between two requests
# Open connections per worker address: the streams of one puller (model_transfer_streams), with room for a retry.
MAX_STREAMS = 16
PER_PEER_CONNECTIONS = MAX_STREAMS + 2
MAX_ERRORS = 20  # connection errors kept for the summary


def _json_object(line: bytes) -> Optional[dict[str, Any]]:
    """The JSON object on ``line``, or None for anything else (a list, garbage, too deeply nested)."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


class Sender:
    """Serve the listed files of ``root`` to the expected peers; record who got what."""

    def __init__(self, root: str, files: Sequence[str], token: str, peers: Mapping[str, str],
                 lifetime: float, per_peer: Optional[int] = None, hello_seconds: Optional[float] = None) -> None:
        resolved = walk_model(root)
        missing = [f for f in files if f not in resolved]
        if missing:
            raise TransferError("the sender cannot serve files missing from %s: %s" % (root, ", ".join(missing)))
        self.files = {f: resolved[f] for f in files}
        self.token = token.encode()
        self.peers = dict(peers)  # fabric ip -> host name
        self.gate = ConnectionGate(self.peers, PER_PEER_CONNECTIONS if per_peer is None else per_peer)
        self.hello_seconds = HELLO_SECONDS if hello_seconds is None else hello_seconds
        self.deadline = time.monotonic() + lifetime
        self.done: set[str] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.served: list[dict[str, Any]] = []
        self.denied: set[str] = set()
        self.busy = 0
        self.errors: list[str] = []
        self.reason = "lifetime ended"

    def _finish_if_done(self) -> None:
        """Stop once every worker said done and none of their connections is still open (a puller's other
        stream may still be receiving after the first one said done)."""
        with self.lock:
            if set(self.peers) <= self.done and self.gate.total() == 0 and not self.stop.is_set():
                self.reason = "every worker done"
                self.stop.set()

    def _deny(self, conn: socket.socket, peer_ip: str, error: str) -> None:
        with self.lock:
            self.denied.add(peer_ip)
        _send_json(conn, {"ok": False, "error": error})

    def handle(self, conn: socket.socket, peer_ip: str) -> None:
        """One admitted connection (``accept`` counted it in the gate): the hello, then requests."""
        reader = LineReader(conn)
        try:
            hello = _json_object(reader.readline(HELLO_LIMIT, self.hello_seconds))
            token = hello.get("token") if hello is not None else None
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token):
                self._deny(conn, peer_ip, "denied: %s did not present this run's token (a puller from another "
                                          "run?); run the play again" % peer_ip)
                return
            _send_json(conn, {"ok": True})
            while True:
                line = reader.readline(REQUEST_LIMIT, REQUEST_SECONDS)
                if not line:
                    return
                request = _json_object(line)
                if request is not None and request.get("op") == "done":
                    with self.lock:
                        self.done.add(peer_ip)
                    _send_json(conn, {"ok": True})
                    return
                path = request.get("path") if request is not None else None
                real = self.files.get(path) if isinstance(path, str) else None
                if request is None or request.get("op") != "get" or real is None:
                    _send_json(conn, {"ok": False, "error": "not served: %s" % str(path)[:200]})
                    return
                offset = request.get("offset", 0)
                if not isinstance(offset, int) or isinstance(offset, bool):
                    _send_json(conn, {"ok": False, "error": "bad offset for %s: %r" % (path, str(offset)[:40])})
                    return
                conn.settimeout(REQUEST_SECONDS)
                with open(real, "rb") as handle:
                    size = os.fstat(handle.fileno()).st_size
                    offset = min(max(0, offset), size)
                    _send_json(conn, {"ok": True, "size": size})
                    start = time.monotonic()
                    sent = conn.sendfile(handle, offset, size - offset) if size > offset else 0
                with self.lock:
                    self.served.append({"peer": peer_ip, "host": self.peers[peer_ip], "path": path,
                                        "offset": offset, "bytes": sent,
                                        "seconds": round(time.monotonic() - start, 3)})
        except Exception as exc:  # pylint: disable=broad-except  # one connection's failure never stops the sender
            with self.lock:
                if len(self.errors) < MAX_ERRORS:
                    self.errors.append("%s: %s" % (peer_ip, exc))
        finally:
            conn.close()
            self.gate.release(peer_ip)
            self._finish_if_done()

    def summary(self) -> dict[str, Any]:
        with self.lock:
            served = list(self.served)
            return {
                "served": served,
                "peers": sorted({s["peer"] for s in served}),
                "denied": sorted(self.denied),
                "busy": self.busy,
                "errors": list(self.errors),
                "done": sorted(self.done),
                "bytes": sum(s["bytes"] for s in served),
                "reason": self.reason,
            }

    def accept(self, conn: socket.socket, peer_ip: str) -> Optional[threading.Thread]:
        """Admit a fabric connection and start its handler, or refuse it before reading a byte."""
        why = self.gate.admit(peer_ip)
        if why is None:
            thread = threading.Thread(target=self.handle, args=(conn, peer_ip), daemon=True)
            thread.start()
            return thread
        with self.lock:
            if why == "not allowed":
                self.denied.add(peer_ip)
            else:
                self.busy += 1
        if why == "not allowed":
            error = "denied: %s is not an expected worker fabric address" % peer_ip
        else:
            error = ("busy: %s already holds %d connections to the sender (its limit); use model_transfer_streams "
                     "%d or fewer" % (peer_ip, self.gate.per_address, MAX_STREAMS))
        refuse(conn, json.dumps({"ok": False, "error": error}).encode() + b"\n")
        return None

    def serve(self, tcp: socket.socket, control: socket.socket, summary_path: Optional[str] = None) -> None:
        waiting: list[socket.socket] = []
        handlers: list[threading.Thread] = []
        while not self.stop.is_set():
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                break
            for sock in select.select([tcp, control], [], [], min(remaining, 0.2))[0]:
                try:
                    conn, addr = sock.accept()
                except OSError:
                    continue
                if sock is control:
                    conn.settimeout(1.0)
                    try:
                        if conn.recv(64).startswith(b"QUIT"):
                            with self.lock:
                                if not self.stop.is_set():
                                    self.reason = "stopped"
                            self.stop.set()
                            waiting.append(conn)
                            continue
                    except OSError:
                        pass
                    conn.close()
                else:
                    thread = self.accept(conn, addr[0])
                    handlers = [t for t in handlers if t.is_alive()] + ([thread] if thread else [])
        tcp.close()
        # Transfers in flight finish (their threads hold their own sockets) before the summary.
        grace = time.monotonic() + 20.0
        for thread in handlers:
            thread.join(timeout=max(0.0, min(self.deadline, grace) - time.monotonic()))
        if summary_path:
            tmp = summary_path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(self.summary(), handle)
            os.replace(tmp, summary_path)
        control.close()  # before BYE: whoever connects after that finds no sender
        for conn in waiting:
            try:
                conn.sendall(b"BYE\n")
            except OSError:
                pass
            finally:
                conn.close()


def bind_sender(ip: str, port: int, wait: float = 3.0) -> tuple[socket.socket, socket.socket]:
    """Bind the control socket and the TCP listener; a stale sender on the port is asked to quit."""
    def bind() -> tuple[socket.socket, socket.socket]:
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            control.bind(control_address(port))
            tcp.bind((ip, port))
            control.listen(8)
            tcp.listen(64)
        except OSError:
            control.close()
            tcp.close()
            raise
        return tcp, control

    try:
        return bind_replacing(bind, lambda: stop_sender(port, None), wait)
    except OSError as exc:
        raise TransferError(listen_error(exc, ip, port, "model_transfer_port"))


def spawn_sender(ip: str, port: int, root: str, files: Sequence[str], token: str, peers: Mapping[str, str],
                 lifetime: float, state_dir: str) -> int:
    """Bind now (errors surface here), then serve from a detached grandchild. Returns its pid.

    Detached as ``_probe.spawn_listener`` is (``_detach.run_detached``).
    """
    sender = Sender(root, files, token, peers, lifetime)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    summary_path = state_file(state_dir, port)
    if os.path.exists(summary_path):
        os.unlink(summary_path)
    tcp, control = bind_sender(ip, port)
    return run_detached(lambda: sender.serve(tcp, control, summary_path), (tcp, control))


def stop_sender(port: int, state_dir: Optional[str], wait: float = 30.0) -> tuple[bool, Optional[dict[str, Any]]]:
    """Stop this node's sender on ``port`` (if running) and return (was_running, its summary)."""
    running = False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(wait)
            conn.connect(control_address(port))
            running = True
            conn.sendall(b"QUIT\n")
            conn.recv(16)  # BYE once the summary is written
    except OSError:
        pass
    if state_dir is None:
        return running, None
    path = state_file(state_dir, port)
    try:
        with open(path) as handle:
            summary = json.load(handle)
        os.unlink(path)
    except (OSError, ValueError):
        summary = None
    return running, summary


# ---------------------------------------------------------------------------
# Puller (worker)
# ---------------------------------------------------------------------------


def partial_sizes(root: str, paths: Sequence[str]) -> dict[str, int]:
    """Bytes already held in ``<file>.partial`` for each path (an interrupted transfer).

    Only a regular file counts: the puller refuses anything else at that name (``_open_partial``).
    """
    sizes = {}
    for path in paths:
        try:
            st = os.lstat(os.path.join(root, path) + PARTIAL_SUFFIX)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            sizes[path] = st.st_size
    return sizes


def final_inodes(root: str, paths: Sequence[str]) -> dict[str, int]:
    """The inode at each path under ``root`` now (0 when there is none), taken when a pull starts.

    The puller renames every received file into place from its ``.partial``, a file of its own, so a path
    whose inode differs later was received by this pull; a wrong file already there keeps its inode.
    """
    inodes = {}
    for path in paths:
        try:
            inodes[path] = os.lstat(os.path.join(root, path)).st_ino
        except OSError:
            inodes[path] = 0
    return inodes


def pull_progress(root: str, entries: Sequence[Mapping[str, Any]], inodes: Mapping[str, int]) -> dict[str, int]:
    """What a running pull has on disk: bytes and files of ``entries`` received so far (``final_inodes`` at start).

    A file renamed into place counts whole; one in flight counts the bytes in its ``.partial`` (resumed
    bytes included). Read from the disk by another process while the pull runs: nothing in the pull's path.
    """
    done = files = total = 0
    for entry in entries:
        path, size = str(entry["path"]), int(entry["size"])
        total += size
        try:
            st = os.lstat(os.path.join(root, path))
            if stat.S_ISREG(st.st_mode) and st.st_ino != inodes.get(path, 0):
                done += size
                files += 1
                continue
        except OSError:
            pass
        try:
            st = os.lstat(os.path.join(root, path) + PARTIAL_SUFFIX)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            done += min(st.st_size, size)
    return {"bytes_done": done, "bytes_total": total, "files_done": files, "files_total": len(entries)}


ANSWER_LIMIT = 65536  # an answer line from the sender; anything longer is not the protocol


class _Connection:
    def __init__(self, server_ip: str, port: int, local_ip: str, token: str, host: str, timeout: float) -> None:
        self.server = "%s:%d" % (server_ip, port)
        self.host = host
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((server_ip, port), timeout=timeout, source_address=(local_ip, 0))
        except OSError as exc:
            raise TransferError("%s: cannot connect from %s to the sender at %s: %s"
                                % (host, local_ip, self.server, exc.strerror or exc))
        try:
            self.sock.settimeout(timeout)
            self.local = self.sock.getsockname()[0]
            answer = self.request({"op": "hello", "token": token, "host": host})
        except OSError as exc:
            self.sock.close()
            raise TransferError("%s: the sender at %s did not answer the hello: %s"
                                % (host, self.server, exc.strerror or exc))
        except TransferError:
            self.sock.close()
            raise
        if not answer.get("ok"):
            self.sock.close()
            raise TransferError("%s: the sender refused the connection: %s" % (host, answer.get("error")))

    def readline(self) -> bytes:
        # One byte at a time: the file's raw bytes follow an answer on the same socket.
        line = b""
        while not line.endswith(b"\n"):
            if len(line) >= ANSWER_LIMIT:
                raise TransferError("%s: the sender at %s sent %d bytes without a newline; it does not speak this "
                                    "version's protocol" % (self.host, self.server, len(line)))
            chunk = self.sock.recv(1)
            if not chunk:
                raise TransferError("%s: the sender at %s closed the connection" % (self.host, self.server))
            line += chunk
        return line

    def request(self, data: Mapping[str, Any]) -> dict[str, Any]:
        _send_json(self.sock, data)
        answer = _json_object(self.readline())
        if answer is None:
            raise TransferError("%s: the sender at %s answered with something other than this version's protocol"
                                % (self.host, self.server))
        return answer

    def abort(self) -> None:
        """Make a receive on this connection return at once (another stream failed)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.request({"op": "done"})
        except (OSError, TransferError):
            pass
        self.sock.close()


# With fsync on, start the disk writes every WRITEBACK_CHUNK bytes instead of leaving the whole file dirty for the
# final fsync: that fsync otherwise stalls the receive (and the sender) for as long as the disk needs for the file.
WRITEBACK_CHUNK = 8 * 1024 * 1024


class _Writeback:
    """Starts the kernel's writeback of what was written, chunk by chunk (POSIX_FADV_DONTNEED on Linux starts
    asynchronous writeback of the range's dirty pages and drops the clean ones, so a large model does not
    crowd the page cache either). A no-op where posix_fadvise is missing or when off."""

    def __init__(self, fd: int, start: int, enabled: bool, chunk: Optional[int] = None) -> None:
        self.fd, self.done, self.pending, self.chunk = fd, start, 0, chunk or WRITEBACK_CHUNK
        self.enabled = enabled and hasattr(os, "posix_fadvise")

    def wrote(self, count: int) -> None:
        if not self.enabled:
            return
        self.pending += count
        if self.pending >= self.chunk:
            try:
                os.posix_fadvise(self.fd, self.done, self.pending, os.POSIX_FADV_DONTNEED)
            except OSError:
                self.enabled = False  # advice only: the final fsync still makes the file durable
            self.done += self.pending
            self.pending = 0


class _Pipeline:
    """Hash and write the slots of a small ring, each stage in its own thread, while the caller receives.

    Per byte the receiver copies from the socket (recv_into), hashes (sha256) and copies into the page
    cache (os.write). hashlib and os.write release the GIL on large buffers, so these three overlap on
    different cores instead of adding up in one thread. Each stage takes the slots in order; a slot is
    refilled only once both stages are done with it. The bytes written are always a prefix of the
    stream (what a resume relies on); the first error of a stage stops the receiver.
    """

    def __init__(self, fd: int, digest: Any, slot_size: int, slots: int, writeback: Optional[_Writeback] = None) -> None:
        self.writeback = writeback or _Writeback(fd, 0, False)
        self.views = [memoryview(bytearray(slot_size)) for _slot in range(slots)]
        self.lengths = [0] * slots
        self.cond = threading.Condition()
        self.produced = 0
        self.consumed = [0, 0]
        self.closed = False
        self.error: Optional[BaseException] = None
        self.fd = fd
        self.threads = [threading.Thread(target=self._stage, args=(0, digest.update), daemon=True),
                        threading.Thread(target=self._stage, args=(1, self._write), daemon=True)]
        for thread in self.threads:
            thread.start()

    def _write(self, view: memoryview) -> None:
        count = len(view)
        while view:
            view = view[os.write(self.fd, view):]
        self.writeback.wrote(count)

    def _stage(self, stage: int, work: Callable[[memoryview], Any]) -> None:
        index = 0
        while True:
            with self.cond:
                while index >= self.produced and not self.closed and self.error is None:
                    self.cond.wait()
                if self.error is not None or index >= self.produced:
                    return
                slot = index % len(self.views)
                view = self.views[slot][:self.lengths[slot]]
            try:
                work(view)
            except BaseException as exc:  # pylint: disable=broad-except  # handed to the receiving thread
                with self.cond:
                    if self.error is None:
                        self.error = exc
                    self.cond.notify_all()
                return
            index += 1
            with self.cond:
                self.consumed[stage] = index
                self.cond.notify_all()

    def next_slot(self) -> memoryview:
        """The next free slot (waits while every slot is still being hashed or written)."""
        with self.cond:
            while self.produced - min(self.consumed) >= len(self.views) and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise self.error
            return self.views[self.produced % len(self.views)]

    def push(self, count: int) -> None:
        with self.cond:
            self.lengths[self.produced % len(self.views)] = count
            self.produced += 1
            self.cond.notify_all()

    def finish(self) -> None:
        """Let both stages drain what was received, then raise the first stage error, if any."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise self.error


def _receive_inline(sock: socket.socket, fd: int, digest: Any, count: int, slot_size: int,
                    writeback: _Writeback) -> int:
    view = memoryview(bytearray(slot_size))
    left = count
    while left:
        got = sock.recv_into(view, min(left, slot_size))
        if not got:
            break
        digest.update(view[:got])
        part = view[:got]
        while part:
            part = part[os.write(fd, part):]
        writeback.wrote(got)
        left -= got
    return count - left


def receive_stream(sock: socket.socket, fd: int, digest: Any, count: int, slot_size: Optional[int] = None,
                   slots: Optional[int] = None, early_writeback: bool = False) -> int:
    """Receive ``count`` bytes from ``sock`` into ``fd`` (at its position), feeding ``digest``.

    Returns the bytes received (less than ``count`` only when the peer closed early). Everything
    received is hashed and written before this returns or raises. ``early_writeback`` (for a file that
    is fsynced at the end) starts the disk writes as the bytes arrive.
    """
    slots = RING_SLOTS if slots is None else slots
    writeback = _Writeback(fd, os.lseek(fd, 0, os.SEEK_CUR), early_writeback)
    if slots < 2:
        return _receive_inline(sock, fd, digest, count, slot_size or SLOT_SIZE, writeback)
    pipeline = _Pipeline(fd, digest, slot_size or SLOT_SIZE, slots, writeback)
    left = count
    try:
        while left:
            view = pipeline.next_slot()
            want = min(left, len(view))
            got = 0
            while got < want:
                chunk = sock.recv_into(view[got:want])
                if not chunk:
                    break
                got += chunk
            if got:
                pipeline.push(got)
            left -= got
            if got < want:
                break
    finally:
        pipeline.finish()
    return count - left


def _describe(path: str) -> str:
    """What sits at ``path`` (for a refusal message)."""
    try:
        if os.path.islink(path):
            return "a symlink to %s" % os.readlink(path)
        st = os.lstat(path)
    except OSError:
        return "not a directory"
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return "a file with %d hard links" % st.st_nlink
    return "a %s" % {stat.S_IFREG: "file", stat.S_IFDIR: "directory", stat.S_IFIFO: "FIFO",
                     stat.S_IFSOCK: "socket", stat.S_IFCHR: "device", stat.S_IFBLK: "device"}.get(
                         stat.S_IFMT(st.st_mode), "special file")


def _open_model_dir(root: str, rel_dir: str, host: str) -> int:
    """A descriptor of ``root``/``rel_dir`` (created as needed), reached without following any link below root.

    ``root`` is the user's model_dir and may itself be a link. Below it, a planted link would steer the write
    out of the model directory (the puller runs as root), so every component must be a real directory: the
    file's real path stays under the model root, and later opens are relative to this descriptor.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked = root
    try:
        for part in rel_dir.split("/") if rel_dir else []:
            walked = os.path.join(walked, part)
            if part in ("", ".", ".."):
                raise TransferError("%s: %s is not a plain path under %s" % (host, walked, root))
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise TransferError("%s: %s is %s, not a directory; the model's files are written only into real "
                                    "directories under %s: remove it and run again"
                                    % (host, walked, _describe(walked), root))
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_partial(dir_fd: int, name: str, shown: str, host: str) -> int:
    """Open (or create) ``<file>.partial`` for reading and writing, refusing anything but this puller's own
    regular file, and lock it so that a second puller into the same (shared) directory is refused."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO cannot hang us
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        fd = -1
    try:
        st = os.fstat(fd) if fd >= 0 else None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise TransferError("%s: %s is %s, not a regular file of its own; the puller writes only into one it "
                                "created: remove it (and find out what put it there), then run again"
                                % (host, shown, _describe(shown)))
        try:
            # flock: per open file, so two pullers on one host collide too; Linux's NFS client maps it to a
            # whole-file lock on the server, so two hosts sharing the directory collide as well.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TransferError("%s: %s is being written by another puller (two hosts or runs pulling into one "
                                "shared model directory?); let one host pull into a shared model_dir, or wait for "
                                "the other pull to end and run again" % (host, shown))
        os.set_blocking(fd, True)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def _receive_file(conn: _Connection, root: str, entry: Mapping[str, Any], fsync: bool) -> dict[str, Any]:
    """Fetch one file into ``<file>.partial`` (resuming), verify its sha256, rename it into place.

    Every error names the file and what to do; the bytes received so far stay in the partial file.
    """
    path = str(entry["path"])
    shown = os.path.join(root, path)
    dir_fd = _open_model_dir(root, os.path.dirname(path), conn.host)
    fd = -1
    try:
        fd = _open_partial(dir_fd, os.path.basename(path) + PARTIAL_SUFFIX, shown + PARTIAL_SUFFIX, conn.host)
        return _receive_into(conn, dir_fd, fd, path, entry, fsync)
    except socket.timeout:
        raise TransferError("%s: receiving %s from the sender at %s stalled for %g s (model_transfer_timeout)%s; "
                            "run again to resume" % (conn.host, shown, conn.server, conn.timeout, _kept(fd, shown)))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TransferError("%s: no space left for %s: %s%s; free space under %s (or choose another "
                                "model_dir) and run again" % (conn.host, shown, exc.strerror, _kept(fd, shown), root))
        raise TransferError("%s: receiving %s from the sender at %s failed: %s%s; run again to resume"
                            % (conn.host, shown, conn.server, exc.strerror or exc, _kept(fd, shown)))
    finally:
        if fd >= 0:
            os.close(fd)
        os.close(dir_fd)


def _kept(fd: int, shown: str) -> str:
    try:
        return ", %d bytes kept in %s%s" % (os.fstat(fd).st_size, shown, PARTIAL_SUFFIX) if fd >= 0 else ""
    except OSError:
        return ""


def _receive_into(conn: _Connection, dir_fd: int, fd: int, path: str, entry: Mapping[str, Any],
                  fsync: bool) -> dict[str, Any]:
    size = int(entry["size"])
    name = os.path.basename(path)
    partial = name + PARTIAL_SUFFIX
    digest = hashlib.sha256()
    offset = os.fstat(fd).st_size
    if offset > size:
        offset = 0
    position = 0
    while position < offset:
        chunk = os.pread(fd, min(offset - position, RECV_BUFFER), position)
        if not chunk:
            break
        digest.update(chunk)
        position += len(chunk)
    answer = conn.request({"op": "get", "path": path, "offset": offset})
    if not answer.get("ok"):
        raise TransferError("%s: the sender did not serve %s: %s" % (conn.host, path, answer.get("error")))
    head_size = answer.get("size")
    if not isinstance(head_size, int) or head_size != size:
        raise TransferError("%s: %s is %s bytes on the head but %d in the manifest; the head's copy changed "
                            "during the run, run again" % (conn.host, path, head_size, size))
    start = time.monotonic()
    os.ftruncate(fd, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    got = receive_stream(conn.sock, fd, digest, size - offset, early_writeback=fsync)
    if got < size - offset:
        raise TransferError("%s: the connection closed with %d bytes of %s left; run again to resume"
                            % (conn.host, size - offset - got, path))
    if fsync:  # once per file, before the rename: the rename must never expose unwritten bytes
        os.fsync(fd)
    seconds = time.monotonic() - start
    sha = digest.hexdigest()
    if sha != entry["sha256"]:
        os.unlink(partial, dir_fd=dir_fd)
        raise TransferError("%s: %s arrived with sha256 %s, expected %s%s; the partial file was removed, run again"
                            % (conn.host, path, sha, entry["sha256"], " (resumed at byte %d)" % offset if offset else ""))
    os.fchmod(fd, 0o644)
    os.replace(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return {"path": path, "offset": offset, "bytes": size - offset, "seconds": round(seconds, 3),
            "sha256": sha, "stat": stat_key(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))}


def pull_files(server_ip: str, port: int, token: str, local_ip: str, host: str, root: str,
               entries: Sequence[Mapping[str, Any]], streams: int = 1, timeout: float = 60.0,
               fsync: bool = True, connect_wait: float = 10.0) -> dict[str, Any]:
    """Pull ``entries`` from the sender into ``root``, over ``streams`` connections from ``local_ip``.

    A file whose resumed bytes turn out wrong (sha256 mismatch after resuming) is fetched once more
    from byte 0. The first error of any stream stops the others at once (their connections are shut, so
    a receive in flight returns) and is the one raised. Returns the files received, the sender address and
    this end's address.
    """
    if not 1 <= streams <= MAX_STREAMS:
        raise TransferError("%s: model_transfer_streams is %d; the sender admits 1 to %d connections per worker: "
                            "set it within that range" % (host, streams, MAX_STREAMS))
    os.makedirs(root, mode=0o755, exist_ok=True)
    queue = list(entries)
    lock = threading.Lock()
    received: list[dict[str, Any]] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    conns: list[_Connection] = []

    def fail(exc: BaseException) -> None:
        with lock:
            errors.append(exc)
            if stop.is_set():
                return  # a later error, often caused by the abort below: the first one is the story
            stop.set()
            others = list(conns)
        for other in others:
            other.abort()

    def connect() -> _Connection:
        deadline = time.monotonic() + connect_wait
        while True:
            try:
                return _Connection(server_ip, port, local_ip, token, host, timeout)
            except TransferError:
                if time.monotonic() > deadline or stop.is_set():
                    raise
                time.sleep(0.2)

    def worker() -> Optional[str]:
        try:
            conn = connect()
        except BaseException as exc:  # pylint: disable=broad-except  # handed to the caller by fail()
            fail(exc)
            return None
        with lock:
            conns.append(conn)
            if stop.is_set():
                conn.abort()
        try:
            while not stop.is_set():
                with lock:
                    if not queue:
                        break
                    entry = queue.pop(0)
                try:
                    result = _receive_file(conn, root, entry, fsync)
                except TransferError as exc:
                    if "resumed at byte" not in str(exc):
                        raise
                    result = _receive_file(conn, root, entry, fsync)
                with lock:
                    received.append(result)
        except BaseException as exc:  # pylint: disable=broad-except  # handed to the caller by fail()
            fail(exc)
        finally:
            conn.close()
        return conn.local

    start = time.monotonic()
    count = max(1, min(streams, len(queue)))
    with ThreadPoolExecutor(max_workers=count) as pool:
        locals_ = [f.result() for f in [pool.submit(worker) for _worker in range(count)]]
    if errors:
        raise errors[0]
    seconds = time.monotonic() - start
    total = sum(r["bytes"] for r in received)
    order = {str(e["path"]): i for i, e in enumerate(entries)}
    received.sort(key=lambda r: order[r["path"]])
    return {
        "received": received,
        "bytes": total,
        "seconds": round(seconds, 3),
        "mib_per_s": round(total / 1048576 / seconds, 1) if seconds > 0 else None,
        "server": "%s:%d" % (server_ip, port),
        "local_address": sorted({a for a in locals_ if a})[0] if locals_ else None,
    }


# ---------------------------------------------------------------------------
# Local copy (a Hugging Face snapshot, or another directory on the head, into model_dir)
# ---------------------------------------------------------------------------


def copy_tree(src: str, dest: str, link: bool = True, dry_run: bool = False,
              copier: Callable[[str, str], Any] = shutil.copyfile) -> list[str]:
    """Materialise ``src`` (symlinks resolved to real files) into ``dest``; returns the paths written.

    A file already present with the same size and mtime is left alone. ``link`` hard-links when
    both are on one filesystem (no second copy of a large model), else copies via ``.partial``.
    """
    try:
        files = walk_model(src)
    except ManifestError as exc:
        raise TransferError(str(exc))
    written = []
    for rel, real in sorted(files.items()):
        target = os.path.join(dest, rel)
        st = os.stat(real)
        try:
            have = os.stat(target)
            if have.st_ino == st.st_ino or (have.st_size == st.st_size and have.st_mtime_ns == st.st_mtime_ns):
                continue
        except FileNotFoundError:
            pass
        written.append(rel)
        if dry_run:
            continue
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        partial = target + PARTIAL_SUFFIX
        try:  # whatever is there, a dangling link included (copyfile would write through it)
            os.unlink(partial)
        except FileNotFoundError:
            pass
        linked = False
        if link:
            try:
                os.link(real, partial)
                linked = True
            except OSError:
                linked = False
        if not linked:
            copier(real, partial)
            os.utime(partial, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.chmod(partial, 0o644)
        os.replace(partial, target)
    return written


def free_bytes(path: str) -> tuple[str, int]:
    """(the existing directory checked, bytes available to an unprivileged writer) for ``path``."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe)
    return probe, st.f_bavail * st.f_frsize
