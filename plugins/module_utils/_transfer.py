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

* ``{"op": "hello", "token": T, "host": H}`` -> ``{"ok": true}``, or ``{"ok": false, "error": ...}``
  and the connection is closed (bad token, or the peer address is not an expected worker's fabric
  address);
* ``{"op": "get", "path": P, "offset": N}`` -> ``{"ok": true, "size": S}`` then ``S - N`` bytes
  (only paths listed when the sender was started are served);
* ``{"op": "done"}`` -> ``{"ok": true}``.

The token is random per run, lives only in the sender's memory and the tasks' (no_log) arguments.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._detach import bind_replacing, listen_error, run_detached
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


class TransferError(Exception):
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


class Sender:
    """Serve the listed files of ``root`` to the expected peers; record who got what."""

    def __init__(self, root: str, files: Sequence[str], token: str, peers: Mapping[str, str],
                 lifetime: float) -> None:
        resolved = walk_model(root)
        missing = [f for f in files if f not in resolved]
        if missing:
            raise TransferError("the sender cannot serve files missing from %s: %s" % (root, ", ".join(missing)))
        self.files = {f: resolved[f] for f in files}
        self.token = token.encode()
        self.peers = dict(peers)  # fabric ip -> host name
        self.deadline = time.monotonic() + lifetime
        self.done: set[str] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.served: list[dict[str, Any]] = []
        self.denied: list[str] = []
        self.reason = "lifetime ended"

    def handle(self, conn: socket.socket, peer_ip: str) -> None:
        conn.settimeout(60.0)
        try:
            reader = conn.makefile("rb")
            hello = json.loads(reader.readline() or b"{}")
            token = str(hello.get("token", "")).encode()
            if peer_ip not in self.peers or not hmac.compare_digest(token, self.token):
                with self.lock:
                    self.denied.append(peer_ip)
                _send_json(conn, {"ok": False, "error": "denied: %s is not an expected worker fabric address or "
                                                        "the token is wrong" % peer_ip})
                return
            _send_json(conn, {"ok": True})
            for line in reader:
                request = json.loads(line)
                if request.get("op") == "done":
                    with self.lock:
                        self.done.add(peer_ip)
                        if set(self.peers) <= self.done and not self.stop.is_set():
                            self.reason = "every worker done"
                            self.stop.set()
                    _send_json(conn, {"ok": True})
                    return
                path = str(request.get("path"))
                real = self.files.get(path)
                if request.get("op") != "get" or real is None:
                    _send_json(conn, {"ok": False, "error": "not served: %s" % path})
                    return
                offset = int(request.get("offset", 0))
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
        except (OSError, ValueError):
            return
        finally:
            conn.close()

    def summary(self) -> dict[str, Any]:
        with self.lock:
            served = list(self.served)
            return {
                "served": served,
                "peers": sorted({s["peer"] for s in served}),
                "denied": sorted(set(self.denied)),
                "done": sorted(self.done),
                "bytes": sum(s["bytes"] for s in served),
                "reason": self.reason,
            }

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
                    thread = threading.Thread(target=self.handle, args=(conn, addr[0]), daemon=True)
                    thread.start()
                    handlers.append(thread)
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
    """Bytes already held in ``<file>.partial`` for each path (an interrupted transfer)."""
    sizes = {}
    for path in paths:
        try:
            sizes[path] = os.stat(os.path.join(root, path) + PARTIAL_SUFFIX).st_size
        except OSError:
            pass
    return sizes


class _Connection:
    def __init__(self, server_ip: str, port: int, local_ip: str, token: str, host: str, timeout: float) -> None:
        try:
            self.sock = socket.create_connection((server_ip, port), timeout=timeout, source_address=(local_ip, 0))
        except OSError as exc:
            raise TransferError("%s: cannot connect from %s to the sender at %s:%d: %s"
                                % (host, local_ip, server_ip, port, exc.strerror or exc))
        self.sock.settimeout(timeout)
        self.local = self.sock.getsockname()[0]
        self.host = host
        answer = self.request({"op": "hello", "token": token, "host": host})
        if not answer.get("ok"):
            raise TransferError("%s: the sender refused the connection: %s" % (host, answer.get("error")))

    def readline(self) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.sock.recv(1)
            if not chunk:
                raise TransferError("%s: the sender closed the connection" % self.host)
            line += chunk
        return line

    def request(self, data: Mapping[str, Any]) -> dict[str, Any]:
        _send_json(self.sock, data)
        return json.loads(self.readline())

    def close(self) -> None:
        try:
            self.request({"op": "done"})
        except (OSError, ValueError, TransferError):
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


def _receive_file(conn: _Connection, root: str, entry: Mapping[str, Any], fsync: bool) -> dict[str, Any]:
    """Fetch one file into ``<file>.partial`` (resuming), verify its sha256, rename it into place."""
    path = str(entry["path"])
    size = int(entry["size"])
    final = os.path.join(root, path)
    partial = final + PARTIAL_SUFFIX
    os.makedirs(os.path.dirname(final), mode=0o755, exist_ok=True)
    digest = hashlib.sha256()
    offset = 0
    if os.path.exists(partial):
        offset = os.stat(partial).st_size
        if offset > size:
            offset = 0
        else:
            with open(partial, "rb") as handle:
                remaining = offset
                while remaining:
                    chunk = handle.read(min(remaining, RECV_BUFFER))
                    if not chunk:
                        break
                    digest.update(chunk)
                    remaining -= len(chunk)
    answer = conn.request({"op": "get", "path": path, "offset": offset})
    if not answer.get("ok"):
        raise TransferError("%s: the sender did not serve %s: %s" % (conn.host, path, answer.get("error")))
    if int(answer["size"]) != size:
        raise TransferError("%s: %s is %d bytes on the head but %d in the manifest; the head's copy changed "
                            "during the run, run again" % (conn.host, path, int(answer["size"]), size))
    start = time.monotonic()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, offset)
        os.lseek(fd, offset, os.SEEK_SET)
        got = receive_stream(conn.sock, fd, digest, size - offset, early_writeback=fsync)
        if got < size - offset:
            raise TransferError("%s: the connection closed with %d bytes of %s left; run again to resume"
                                % (conn.host, size - offset - got, path))
        if fsync:  # once per file, before the rename: the rename must never expose unwritten bytes
            os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.monotonic() - start
    sha = digest.hexdigest()
    if sha != entry["sha256"]:
        os.unlink(partial)
        raise TransferError("%s: %s arrived with sha256 %s, expected %s%s; the partial file was removed, run again"
                            % (conn.host, path, sha, entry["sha256"], " (resumed at byte %d)" % offset if offset else ""))
    os.chmod(partial, 0o644)
    os.replace(partial, final)
    return {"path": path, "offset": offset, "bytes": size - offset, "seconds": round(seconds, 3),
            "sha256": sha, "stat": stat_key(os.stat(final))}


def pull_files(server_ip: str, port: int, token: str, local_ip: str, host: str, root: str,
               entries: Sequence[Mapping[str, Any]], streams: int = 1, timeout: float = 60.0,
               fsync: bool = True, connect_wait: float = 10.0) -> dict[str, Any]:
    """Pull ``entries`` from the sender into ``root``, over ``streams`` connections from ``local_ip``.

    A file whose resumed bytes turn out wrong (sha256 mismatch after resuming) is fetched once more
    from byte 0. Returns the files received, the sender address and this end's address.
    """
    os.makedirs(root, mode=0o755, exist_ok=True)
    queue = list(entries)
    lock = threading.Lock()
    received: list[dict[str, Any]] = []

    def connect() -> _Connection:
        deadline = time.monotonic() + connect_wait
        while True:
            try:
                return _Connection(server_ip, port, local_ip, token, host, timeout)
            except TransferError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def worker() -> Optional[str]:
        conn = connect()
        try:
            while True:
                with lock:
                    if not queue:
                        return conn.local
                    entry = queue.pop(0)
                try:
                    result = _receive_file(conn, root, entry, fsync)
                except TransferError as exc:
                    if "resumed at byte" not in str(exc):
                        raise
                    result = _receive_file(conn, root, entry, fsync)
                with lock:
                    received.append(result)
        finally:
            conn.close()

    start = time.monotonic()
    count = max(1, min(streams, len(queue)))
    with ThreadPoolExecutor(max_workers=count) as pool:
        locals_ = [f.result() for f in [pool.submit(worker) for _worker in range(count)]]
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
        if os.path.exists(partial):
            os.unlink(partial)
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
