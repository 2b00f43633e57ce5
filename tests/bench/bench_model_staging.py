# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Model staging benchmark over the lab (root; docs/benchmarks.md, "Model staging").

Root, from the repo root: ``.venv/bin/python tests/bench/bench_model_staging.py``.

In one run, side by side on the same spark1 -> spark2 fabric link:
  1. raw TCP (tests/bench/tcp_throughput.py: plain socket sender on spark1's fabric address, receiver on
     spark2's, bytes discarded), before and after the staging runs;
  2. staging a generated model (BENCH_MODEL_MIB, default 1088 MiB = 4 random safetensors-like files) with
     playbooks/model.yml: the worker's transfer throughput (receive + sha256 + write + fsync + rename),
     the role's wall time, the head's first hashing; then the same with model_fsync=false;
  3. the no-change re-run (the role's tasks only).
BENCH_STREAMS sets model_transfer_streams (default 2, as the role). With BENCH_LINK_RATE (a tc rate such as ``2gbit``),
spark1's fabric egress is shaped to it (tbf) for the whole run: a link slower than this machine's disk, as most
fabrics are not but some links are, so that what is compared is
the protocol's overhead, not the disk. Without it the veth runs at memory speed and the disk bounds staging.
The model is generated in spark1's private /var/lib/multinode-vllm/models and deleted afterwards on both nodes.
Prints one JSON object and the markdown rows for docs/benchmarks.md.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LABCTL = os.path.join(ROOT, "lab", "labctl")
NAME = "bench-staging"
MODEL = "/var/lib/multinode-vllm/models/" + NAME
MIB = int(os.environ.get("BENCH_MODEL_MIB", "1088"))
FILES = 4
HEAD_IP, WORKER_IP, PORT = "198.18.200.12", "198.18.200.13", 29520
LINK_RATE = os.environ.get("BENCH_LINK_RATE", "")
STREAMS = int(os.environ.get("BENCH_STREAMS", "2"))  # model_transfer_streams (the role default)
FABRIC_IF = "enp1s0f1np1"


def labctl(*args: str, check: bool = True) -> str:
    out = subprocess.run([LABCTL, *args], capture_output=True, text=True, check=False)
    if check and out.returncode:
        sys.exit("labctl %s: %s%s" % (" ".join(args), out.stdout, out.stderr))
    return out.stdout


def on(host: str, *cmd: str, check: bool = True) -> str:
    return labctl("exec", host, "--", *cmd, check=check)


def cleanup() -> None:
    for host in ("spark1", "spark2"):
        on(host, "sh", "-c", "rm -rf %s /var/lib/multinode-vllm/manifest-cache /var/lib/multinode-vllm/model-transfer"
           % MODEL, check=False)


def generate() -> float:
    start = time.monotonic()
    on("spark1", "python3", "-c", (
        "import os\nr=%r;os.makedirs(r,exist_ok=True)\nopen(r+'/config.json','w').write('{}')\n"
        "for i in range(%d):\n"
        "    with open(r+'/model-%%05d-of-%05d.safetensors'%%(i+1),'wb') as f:\n"
        "        for _ in range(%d): f.write(os.urandom(16<<20))\n") % (MODEL, FILES, FILES, MIB // FILES // 16))
    return time.monotonic() - start


def raw_tcp() -> dict:
    script = os.path.join(ROOT, "tests", "bench", "tcp_throughput.py")
    receiver = subprocess.Popen([LABCTL, "exec", "spark2", "--", sys.executable, script, "recv", WORKER_IP, str(PORT)],
                                stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    on("spark1", sys.executable, script, "send", WORKER_IP, str(PORT), str(MIB), "--bind", HEAD_IP)
    result = json.loads(receiver.communicate(timeout=120)[0].strip().splitlines()[-1])
    return {"MiBps": round(result["bytes"] / result["seconds"] / 1048576, 1), "seconds": result["seconds"],
            "peer": result["peer"]}


def playbook(*extra: str) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               PYTHONPATH=os.path.join(ROOT, ".cache", "collections"))
    out = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", os.path.join(ROOT, "inventories", "lab"),
                          os.path.join(ROOT, "playbooks", "model.yml"), "-e", "model_name=" + NAME,
                          "-e", "model_transfer_streams=%d" % STREAMS, *extra],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    data = json.loads(out.stdout[out.stdout.find("{"):])
    if out.returncode:
        sys.exit("playbook failed: %s" % json.dumps(data["stats"]))
    play = data["plays"][-1]

    def parse(stamp):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    tasks = {t["task"]["name"].split(" : ", 1)[-1]: t for t in play["tasks"]}

    def seconds(task):
        return round((parse(task["task"]["duration"]["end"]) - parse(task["task"]["duration"]["start"])).total_seconds(), 2)

    result = {"role_seconds": round((max(parse(t["task"]["duration"]["end"]) for t in play["tasks"])
                                    - min(parse(t["task"]["duration"]["start"]) for t in play["tasks"])).total_seconds(), 2)}
    head = [t for n, t in tasks.items() if n.startswith("Manifest of the model on the head")][0]
    result["head_manifest_seconds"] = seconds(head)
    result["head_hashed"] = head["hosts"]["spark1"]["counts"]["hashed"]
    shown = [t for n, t in tasks.items() if n.startswith("Show what each worker received")]
    if shown and not shown[0]["hosts"]["spark2"].get("skipped"):
        msg = shown[0]["hosts"]["spark2"]["msg"]
        match = re.search(r"received (\d+) file\(s\), (\d+)\s+bytes in ([\d.]+) s \(([\d.]+) MiB/s\)", msg)
        result.update(files=int(match.group(1)), bytes=int(match.group(2)), transfer_seconds=float(match.group(3)),
                      MiBps=float(match.group(4)))
        pull = [t for n, t in tasks.items() if n.startswith("Pull the missing files")][0]
        result["pull_task_seconds"] = seconds(pull)
        served = [t for n, t in tasks.items() if n.startswith("Show what the sender served")][0]
        result["served_peers"] = served["hosts"]["spark1"]["msg"]["peers"]
    return result


def main() -> int:
    if os.geteuid() != 0:
        sys.exit("needs root (the lab)")
    labctl("up", "2")
    cleanup()
    report = {"model_mib": MIB, "files": FILES + 1, "cores": os.cpu_count(), "link_rate": LINK_RATE or "unshaped", "streams": STREAMS,
              "when": datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%S UTC")}
    try:
        if LINK_RATE:
            on("spark1", "tc", "qdisc", "replace", "dev", FABRIC_IF, "root", "tbf", "rate", LINK_RATE,
               "burst", "512kb", "latency", "100ms")
        report["generate_seconds"] = round(generate(), 1)
        report["raw_tcp_before"] = raw_tcp()
        report["staging"] = playbook()
        report["raw_tcp_after"] = raw_tcp()
        report["rerun"] = playbook()
        on("spark2", "sh", "-c", "rm -rf %s" % MODEL)
        report["staging_no_fsync"] = playbook("-e", "model_fsync=false")
    finally:
        if LINK_RATE:
            on("spark1", "tc", "qdisc", "del", "dev", FABRIC_IF, "root", check=False)
        cleanup()
    raw = (report["raw_tcp_before"]["MiBps"] + report["raw_tcp_after"]["MiBps"]) / 2
    report["ratio"] = round(report["staging"]["MiBps"] / raw, 2)
    report["ratio_no_fsync"] = round(report["staging_no_fsync"]["MiBps"] / raw, 2)
    print(json.dumps(report, indent=1))
    s, n = report["staging"], report["staging_no_fsync"]
    print("| %s, %d stream(s) | %d MiB, %d files | %.0f / %.0f MiB/s | %.0f MiB/s (%.2f) | %.0f MiB/s (%.2f) | %.1f s | %.1f s | %.2f s |" % (
        report["link_rate"], STREAMS, MIB, FILES + 1, report["raw_tcp_before"]["MiBps"], report["raw_tcp_after"]["MiBps"], s["MiBps"], report["ratio"],
        n["MiBps"], report["ratio_no_fsync"], s["role_seconds"], s["head_manifest_seconds"], report["rerun"]["role_seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
