# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model transfer path against raw TCP, side by side, on a veth pair of this machine (root).

From the repo root: ``.venv/bin/python tests/bench/bench_transfer_local.py [--mib 1024] [--files 4]
[--dir /var/tmp] [--before-ref main] [--repeat 3] [--only NAME,...] [--variants ...]``.

It does not use the lab: it creates its own network namespaces ``mvxfer-a`` (sender, 10.77.4.1) and
``mvxfer-b`` (receiver, 10.77.4.2) joined by a veth pair, and removes them (and its files) in any case.
It generates ``--mib`` MiB of random files in a temporary directory under ``--dir`` (the target
filesystem) and measures, one after the other in one run:

* ``sha256_1core``: hashlib sha256 of 1 GiB in memory, one thread (the ceiling of one file's stream);
* ``disk_write`` / ``disk_write_fsync``: writing the same bytes to ``--dir`` without / with fsync;
* ``raw_tcp`` (before and after the rest): tests/bench/tcp_throughput.py, bytes discarded;
* ``raw_tcp_write``, ``raw_tcp_hash``, ``raw_tcp_hash_write``, ``raw_tcp_hash_write_fsync``: the same sender,
  a receiver (one thread, 4 MiB recv_into) that also writes the files, hashes, both, both and fsyncs;
* ``before[_nofsync]``: the collection's Sender and pull_files as of ``--before-ref`` (git archive of that
  ref's plugins/module_utils, imported from a temporary collection tree);
* ``after[_nofsync]``, ``after_2streams[_nofsync]``: this checkout's, with 1 and 2 streams;
* ``after_<label>`` (``--variants label:NAME=INT,...;...``): this checkout's without fsync, with module
  constants of _transfer changed (``ring:RING_SLOTS=4`` forces the pipelined receiver, ``inline:RING_SLOTS=1``
  one thread; the default depends on the CPUs, see _transfer.RING_SLOTS).

Each row gives MiB/s over the wire time, the ratio to raw TCP (the mean of the runs before and after) and
the CPU seconds per GiB the whole machine spent (from /proc/stat; other load on the machine counts too).
Prints one JSON object, then a markdown table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TCP = os.path.join(ROOT, "tests", "bench", "tcp_throughput.py")
NS_A, NS_B, VETH_A, VETH_B = "mvxfer-a", "mvxfer-b", "mvxfer-va", "mvxfer-vb"
IP_A, IP_B = "10.77.4.1", "10.77.4.2"
PORT = 29571
TOKEN = "bench-token"
CHUNK = 4 * 1024 * 1024


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def netns_up() -> None:
    netns_down()
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    sh("ip", "link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns", NS_B)
    sh("ip", "-n", NS_A, "addr", "add", IP_A + "/24", "dev", VETH_A)
    sh("ip", "-n", NS_B, "addr", "add", IP_B + "/24", "dev", VETH_B)
    for ns, dev in ((NS_A, VETH_A), (NS_B, VETH_B)):
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", dev, "up")


def netns_down() -> None:
    for ns in (NS_A, NS_B):  # deleting a namespace deletes its end of the veth, and so the pair
        sh("ip", "netns", "del", ns, check=False)


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, *args]


def busy_jiffies() -> int:
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def cpu_seconds(start: int) -> float:
    return (busy_jiffies() - start) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU seconds (user + system, every thread) of this process: the receiver's own cost."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drop_dirty() -> None:
    """Write back what earlier runs left dirty, so that no run pays for another's writeback."""
    os.sync()


def generate(model: str, mib: int, files: int) -> list[str]:
    os.makedirs(model)
    names = ["model-%05d-of-%05d.safetensors" % (i + 1, files) for i in range(files)]
    block = 16 * 1024 * 1024
    for name in names:
        with open(os.path.join(model, name), "wb") as handle:
            for _block in range(max(1, mib * 1024 * 1024 // files // block)):
                handle.write(os.urandom(block))
    with open(os.path.join(model, "config.json"), "w") as handle:
        handle.write("{}")
    return names


# ---------------------------------------------------------------------------
# Child roles (run inside a namespace)
# ---------------------------------------------------------------------------


def child_sink(args: argparse.Namespace) -> None:
    """One-thread receiver: recv_into a 4 MiB buffer, then optionally hash, write (file by file), fsync."""
    import socket
    sizes = json.loads(args.sizes)
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((IP_B, PORT))
        srv.listen(1)
        srv.settimeout(60)
        conn, _peer = srv.accept()
        view = memoryview(bytearray(CHUNK))
        start = None
        total = 0
        with conn:
            for index, size in enumerate(sizes):
                fd = os.open(os.path.join(args.dest, "f%d" % index), os.O_WRONLY | os.O_CREAT | os.O_TRUNC) \
                    if args.write else -1
                digest = hashlib.sha256()
                left = size
                while left:
                    count = conn.recv_into(view, min(left, CHUNK))
                    if not count:
                        raise SystemExit("sink: the sender closed early")
                    if start is None:
                        start, jiffies, usage = time.perf_counter(), busy_jiffies(), own_cpu()
                    if args.write:
                        part = view[:count]
                        while part:
                            part = part[os.write(fd, part):]
                    if args.hash:
                        digest.update(view[:count])
                    left -= count
                    total += count
                if args.write:
                    if args.fsync:
                        os.fsync(fd)
                    os.close(fd)
            conn.sendall(b"k")
    print(json.dumps({"bytes": total, "seconds": time.perf_counter() - start, "cpu": cpu_seconds(jiffies),
                      "recv_cpu": own_cpu() - usage}))


def child_sendfile(args: argparse.Namespace) -> None:
    """Sender for the sink: the model's files, sendfile, one connection (the Sender's way of sending)."""
    import socket
    with socket.create_connection((IP_B, PORT), timeout=60, source_address=(IP_A, 0)) as conn:
        for path in json.loads(args.paths):
            with open(path, "rb") as handle:
                conn.sendfile(handle)
        conn.recv(1)


def load_transfer(collections: str):
    sys.path.insert(0, collections)
    from ansible_collections.multinode.vllm.plugins.module_utils import _transfer  # pylint: disable=import-outside-toplevel
    return _transfer


def child_serve(args: argparse.Namespace) -> None:
    transfer = load_transfer(args.collections)
    files = json.loads(args.paths)
    sender = transfer.Sender(args.model, files, TOKEN, {IP_B: "bench-b"}, lifetime=300)
    tcp, control = transfer.bind_sender(IP_A, PORT)
    print("ready", flush=True)
    sender.serve(tcp, control)


def child_pull(args: argparse.Namespace) -> None:
    transfer = load_transfer(args.collections)
    for item in filter(None, (args.tune or "").split(",")):
        name, value = item.split("=")
        setattr(transfer, name, int(value))
    entries = json.loads(args.entries)
    jiffies, usage = busy_jiffies(), own_cpu()
    result = transfer.pull_files(IP_A, PORT, TOKEN, IP_B, "bench-b", args.dest, entries, streams=args.streams,
                                 fsync=args.fsync, connect_wait=10)
    print(json.dumps({"bytes": result["bytes"], "seconds": result["seconds"], "cpu": cpu_seconds(jiffies),
                      "recv_cpu": own_cpu() - usage}))


# ---------------------------------------------------------------------------
# Measurements (parent)
# ---------------------------------------------------------------------------


def measure_sha256(mib: int = 1024) -> dict:
    block = os.urandom(CHUNK)
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _block in range(mib * 1024 * 1024 // CHUNK):
        digest.update(block)
    seconds = time.perf_counter() - start
    return {"MiBps": round(mib / seconds, 1), "seconds": round(seconds, 3)}


def measure_disk(model: str, files: list[str], dest: str, fsync: bool) -> dict:
    os.makedirs(dest)
    drop_dirty()
    total = 0
    jiffies = busy_jiffies()
    start = time.perf_counter()
    for name in files:
        with open(os.path.join(model, name), "rb") as src:
            fd = os.open(os.path.join(dest, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            while True:
                data = src.read(CHUNK)
                if not data:
                    break
                os.write(fd, data)
                total += len(data)
            if fsync:
                os.fsync(fd)
            os.close(fd)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(jiffies)
    shutil.rmtree(dest)
    return {"MiBps": round(total / seconds / 1048576, 1), "seconds": round(seconds, 3),
            "cpu_s_per_GiB": round(cpu / (total / 2 ** 30), 2)}


def run_pair(receiver: list[str], sender: list[str], wait_ready: bool = False) -> dict:
    """Start the receiver (or the sender first when ``wait_ready``), run the other, return the JSON line."""
    drop_dirty()
    first = subprocess.Popen(receiver if not wait_ready else sender, stdout=subprocess.PIPE, text=True)
    try:
        if wait_ready:
            if first.stdout.readline().strip() != "ready":
                raise SystemExit("bench: the sender did not start: %s" % " ".join(sender))
        else:
            time.sleep(0.5)
        second = subprocess.run(receiver if wait_ready else sender, capture_output=True, text=True, timeout=600,
                                check=False)
        if second.returncode:
            raise SystemExit("bench: %s failed: %s" % (" ".join(second.args), second.stderr[-2000:]))
        out = first.communicate(timeout=120)[0]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    text = second.stdout if wait_ready else out
    return json.loads(text.strip().splitlines()[-1])


def row(result: dict) -> dict:
    """MiB/s over the receiver's timed window, and the machine's busy CPU seconds per GiB in that window."""
    total = result["bytes"]
    out = {"MiBps": round(total / result["seconds"] / 1048576, 1), "seconds": round(result["seconds"], 3),
           "bytes": total}
    if "cpu" in result:
        out["cpu_s_per_GiB"] = round(result["cpu"] / (total / 2 ** 30), 2)
        out["recv_cpu_s_per_GiB"] = round(result["recv_cpu"] / (total / 2 ** 30), 2)
    return out


def measure_raw(mib: int) -> dict:
    return row(run_pair(in_ns(NS_B, TCP, "recv", IP_B, str(PORT)),
                        in_ns(NS_A, TCP, "send", IP_B, str(PORT), str(mib), "--bind", IP_A, "--chunk-kib", "4096")))


def measure_sink(model: str, files: list[str], dest: str, write: bool, hash_: bool, fsync: bool) -> dict:
    os.makedirs(dest)
    paths = [os.path.join(model, f) for f in files]
    sizes = [os.path.getsize(p) for p in paths]
    flags = (["--write"] if write else []) + (["--hash"] if hash_ else []) + (["--fsync"] if fsync else [])
    result = run_pair(in_ns(NS_B, __file__, "_sink", "--dest", dest, "--sizes", json.dumps(sizes), *flags),
                      in_ns(NS_A, __file__, "_sendfile", "--paths", json.dumps(paths)))
    shutil.rmtree(dest)
    return row(result)


def measure_transfer(collections: str, model: str, entries: list[dict], dest: str, streams: int,
                     fsync: bool, tune: str = "") -> dict:
    result = run_pair(
        in_ns(NS_B, __file__, "_pull", "--collections", collections, "--tune", tune, "--dest", dest, "--entries", json.dumps(entries),
              "--streams", str(streams), *(["--fsync"] if fsync else [])),
        in_ns(NS_A, __file__, "_serve", "--collections", collections, "--model", model,
              "--paths", json.dumps([e["path"] for e in entries])),
        wait_ready=True)
    for entry in entries:  # the transfer verified it; check once more, from the disk, outside the timing
        with open(os.path.join(dest, entry["path"]), "rb") as handle:
            if hashlib.file_digest(handle, "sha256").hexdigest() != entry["sha256"]:
                raise SystemExit("bench: %s arrived wrong in %s" % (entry["path"], dest))
    shutil.rmtree(dest)
    return row(result)


def collection_tree(work: str, name: str, ref: str = "") -> str:
    """A sys.path entry holding ansible_collections/multinode/vllm: this checkout, or ``ref``'s module_utils."""
    base = os.path.join(work, name)
    dest = os.path.join(base, "ansible_collections", "multinode", "vllm")
    os.makedirs(os.path.dirname(dest))
    if not ref:
        os.symlink(ROOT, dest)
        return base
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "plugins/module_utils"], capture_output=True,
                             check=False)
    if archive.returncode:
        raise SystemExit("bench: git archive %s failed: %s; pass --before-ref with a ref of this repository"
                         % (ref, archive.stderr.decode()))
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    return base


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("role", nargs="?", default="bench")
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--before-ref", default="main")
    parser.add_argument("--only", default="")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default="", help="LABEL:NAME=INT,...;... extra rows of this checkout's "
                        "transfer (no fsync) with _transfer constants changed, e.g. inline:RING_SLOTS=1")
    parser.add_argument("--tune", default="", help="NAME=INT,... module constants of _transfer to override (after)")
    # child roles
    parser.add_argument("--dest")
    parser.add_argument("--sizes")
    parser.add_argument("--paths")
    parser.add_argument("--entries")
    parser.add_argument("--model")
    parser.add_argument("--collections")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--hash", action="store_true")
    parser.add_argument("--fsync", action="store_true")
    args = parser.parse_args(argv)
    roles = {"_sink": child_sink, "_sendfile": child_sendfile, "_serve": child_serve, "_pull": child_pull}
    if args.role in roles:
        roles[args.role](args)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (it creates the network namespaces %s and %s)" % (NS_A, NS_B))
    work = tempfile.mkdtemp(prefix="mvxfer-", dir=args.dir)
    report: dict = {"mib": args.mib, "files": args.files, "dir": args.dir, "cores": os.cpu_count(),
                    "before_ref": args.before_ref, "python": sys.version.split()[0],
                    "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        netns_up()
        model = os.path.join(work, "model")
        files = generate(model, args.mib, args.files)
        sys.path.insert(0, collection_tree(work, "after"))
        from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest  # pylint: disable=import-outside-toplevel
        start = time.perf_counter()
        entries = build_manifest(model)[0]["files"]
        report["head_manifest_seconds"] = round(time.perf_counter() - start, 2)
        trees = {"before": collection_tree(work, "before", args.before_ref), "after": os.path.join(work, "after")}
        dest = os.path.join(work, "dest")
        plan = [
            ("sha256_1core", measure_sha256),
            ("disk_write", lambda: measure_disk(model, files, dest, False)),
            ("disk_write_fsync", lambda: measure_disk(model, files, dest, True)),
            ("raw_tcp", lambda: measure_raw(args.mib)),
            ("raw_tcp_sendfile", lambda: measure_sink(model, files, dest, False, False, False)),
            ("raw_tcp_write", lambda: measure_sink(model, files, dest, True, False, False)),
            ("raw_tcp_hash", lambda: measure_sink(model, files, dest, False, True, False)),
            ("raw_tcp_hash_write", lambda: measure_sink(model, files, dest, True, True, False)),
            ("raw_tcp_hash_write_fsync", lambda: measure_sink(model, files, dest, True, True, True)),
            ("before_nofsync", lambda: measure_transfer(trees["before"], model, entries, dest, 1, False)),
            ("after_nofsync", lambda: measure_transfer(trees["after"], model, entries, dest, 1, False, args.tune)),
            ("after_2streams_nofsync", lambda: measure_transfer(trees["after"], model, entries, dest, 2, False)),
            ("before", lambda: measure_transfer(trees["before"], model, entries, dest, 1, True)),
            ("after", lambda: measure_transfer(trees["after"], model, entries, dest, 1, True)),
            ("after_2streams", lambda: measure_transfer(trees["after"], model, entries, dest, 2, True)),
        ]
        for variant in filter(None, args.variants.split(";")):  # after_<label>: this checkout, constants changed
            label, tune = variant.split(":", 1)
            plan.append(("after_" + label, lambda tune=tune: measure_transfer(trees["after"], model, entries, dest, 1,
                                                                              False, tune)))
        plan.append(("raw_tcp_again", lambda: measure_raw(args.mib)))
        only = set(filter(None, args.only.split(","))) | {"raw_tcp", "raw_tcp_again"} | {
            "after_" + v.split(":", 1)[0] for v in filter(None, args.variants.split(";"))}
        plan = [(name, measure) for name, measure in plan if not args.only or name in only]
        runs: dict[str, list[dict]] = {name: [] for name, _measure in plan}
        for _round in range(args.repeat):  # round by round: load from elsewhere hits every row alike
            for name, measure in plan:
                runs[name].append(measure())
                print("%s: %s" % (name, json.dumps(runs[name][-1])), file=sys.stderr, flush=True)
        for name, results in runs.items():
            ordered = sorted(results, key=lambda r: r["MiBps"])
            report[name] = dict(ordered[len(ordered) // 2], runs_MiBps=[r["MiBps"] for r in results])
    finally:
        netns_down()
        shutil.rmtree(work, ignore_errors=True)
    raw = (report["raw_tcp"]["MiBps"] + report["raw_tcp_again"]["MiBps"]) / 2
    report["raw_tcp_mean_MiBps"] = round(raw, 1)
    for name, value in report.items():
        if isinstance(value, dict) and "MiBps" in value:
            value["ratio_to_raw_tcp"] = round(value["MiBps"] / raw, 3)
    print(json.dumps(report, indent=1))
    print("| measurement (median of %d) | MiB/s | ratio to raw TCP | CPU s/GiB, machine | CPU s/GiB, receiver "
          "process | runs MiB/s |" % args.repeat)
    print("|---|---:|---:|---:|---:|---|")
    for name, value in report.items():
        if isinstance(value, dict) and "MiBps" in value:
            print("| %s | %.0f | %.2f | %s | %s | %s |" % (
                name, value["MiBps"], value["ratio_to_raw_tcp"], value.get("cpu_s_per_GiB", ""),
                value.get("recv_cpu_s_per_GiB", ""),
                " ".join("%.0f" % v for v in value.get("runs_MiBps", [value["MiBps"]]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
