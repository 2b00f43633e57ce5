# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Raw TCP throughput over one link: a plain socket receiver and sender (standard library only).

  receiver:  python3 tcp_throughput.py recv <bind ip> <port>            (prints one JSON line, then exits)
  sender:    python3 tcp_throughput.py send <dst ip> <port> <MiB> [--bind <src ip>] [--chunk-kib 1024]

The sender writes <MiB> MiB in chunks from one buffer; the receiver reads
until EOF and reports bytes, seconds (first byte to EOF) and GB/s, Gbit/s.
It is the baseline for the distributed preflight's all-reduce bandwidth
(docs/benchmarks.md, "Distributed preflight").
"""

import json
import socket
import sys
import time


def recv(bind_ip, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind_ip, port))
        srv.listen(1)
        srv.settimeout(60)
        conn, peer = srv.accept()
        with conn:
            buf = bytearray(4 << 20)
            view = memoryview(buf)
            total = 0
            first = None
            while True:
                n = conn.recv_into(view)
                if not n:
                    break
                if first is None:
                    first = time.perf_counter()
                total += n
            seconds = time.perf_counter() - (first or time.perf_counter())
    gbps = total / seconds / 1e9 if seconds else 0.0
    print(json.dumps({"role": "recv", "peer": peer[0], "bytes": total, "seconds": round(seconds, 4),
                      "GBps": round(gbps, 4), "Gbitps": round(gbps * 8, 3)}))


def send(dst_ip, port, mib, bind_ip=None, chunk_kib=1024):
    payload = memoryview(bytes(chunk_kib * 1024))
    total = int(mib * 1024 * 1024)
    with socket.create_connection((dst_ip, port), timeout=30, source_address=(bind_ip, 0) if bind_ip else None) as s:
        start = time.perf_counter()
        sent = 0
        while sent < total:
            n = min(len(payload), total - sent)
            s.sendall(payload[:n])
            sent += n
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        seconds = time.perf_counter() - start
    print(json.dumps({"role": "send", "bytes": sent, "seconds": round(seconds, 4),
                      "GBps": round(sent / seconds / 1e9, 4)}))


def main(argv):
    if len(argv) >= 3 and argv[0] == "recv":
        recv(argv[1], int(argv[2]))
        return 0
    if len(argv) >= 4 and argv[0] == "send":
        bind_ip = argv[argv.index("--bind") + 1] if "--bind" in argv else None
        chunk = int(argv[argv.index("--chunk-kib") + 1]) if "--chunk-kib" in argv else 1024
        send(argv[1], int(argv[2]), float(argv[3]), bind_ip, chunk)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
