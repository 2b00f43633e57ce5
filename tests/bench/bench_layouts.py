# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""TP=2 across the two lab nodes against one replica per node (TP=1, each node its own head), with bench.yml.

Root, from the repo root: ``.venv/bin/python tests/bench/bench_layouts.py`` (``make bench-layouts``). Brings a fresh
2-node process lab up, deploys TP=2 (the lab inventory) and benches it; tears it down; deploys one single-node
cluster per node (an inventory each, TP=1) and benches both replicas at the same time, each into its own results
directory, so the two layouts use the same two nodes (here, the same two cores) and the replicas' sum is what a
client spreading requests over them would get. Prints the side-by-side table and, unless BENCH_WRITE=0, writes it to
docs/benchmarks.md (section "Layouts: TP=2 against one replica per node"). Leaves the lab down.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LABCTL = ROOT / "lab" / "labctl"
PLAYBOOK = ROOT / ".venv" / "bin" / "ansible-playbook"
OUT = Path(os.environ.get("OUT", ROOT / ".cache" / "bench-layouts"))
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Layouts: TP=2 against one replica per node"
NODES = ("spark1", "spark2")


def env() -> dict:
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PYTHONPATH=str(ROOT / ".cache" / "collections"),
                PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ.get("PATH", "")))


def playbook(inventory: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """ansible-playbook started on ``inventory``; its output goes to a log file under OUT."""
    path = OUT / ("%s-%s-%d.log" % (inventory.name, name, time.monotonic_ns()))
    with open(path, "w") as log:
        proc = subprocess.Popen([str(PLAYBOOK), "-i", str(inventory), "playbooks/%s.yml" % name, *args], cwd=ROOT,
                                env=env(), stdout=log, stderr=subprocess.STDOUT)
    return proc, path


def run(inventory: Path, name: str, *args: str) -> None:
    proc, path = playbook(inventory, name, *args)
    if proc.wait() != 0:
        raise SystemExit("%s.yml on %s failed; its log: %s" % (name, inventory, path))


def single_node_inventory(node: str) -> Path:
    """The lab inventory with ``node`` as the only host, its head: a one-node cluster, TP=1."""
    inv = OUT / ("inventory-%s" % node)
    shutil.copytree(ROOT / "inventories" / "lab", inv)
    (inv / "hosts.yml").write_text(
        "# One replica per node: %s alone, its own head (tests/bench/bench_layouts.py).\n"
        "all:\n  children:\n    vllm_cluster:\n      children:\n        ray_head:\n          hosts:\n"
        "            %s:\n        ray_workers:\n          hosts: {}\n" % (node, node))
    return inv


def rows(results_dir: Path) -> list[dict]:
    return json.loads((results_dir / "results.json").read_text())["rows"]


def table(tp2: list[dict], replicas: dict[str, list[dict]]) -> list[str]:
    lines = ["| case | TP=2 output tok/s | TP=2 TTFT p50 ms | %s | replicas' sum tok/s | sum / TP=2 |" % " | ".join(
        "%s tok/s (TTFT p50 ms)" % node for node in replicas), "|---|---|---|%s---|---|" % ("---|" * len(replicas))]
    for row in tp2:
        key = (row["concurrency"], row["input_len"], row["output_len"])
        per = [next(r for r in rs if (r["concurrency"], r["input_len"], r["output_len"]) == key)
               for rs in replicas.values()]
        total = sum(r["output_tokens_per_s"] for r in per)
        lines.append("| c%d %d/%d | %.2f | %.1f | %s | %.2f | %.2f |" % (
            key[0], key[1], key[2], row["output_tokens_per_s"], row["p50_ttft_ms"],
            " | ".join("%.2f (%.1f)" % (r["output_tokens_per_s"], r["p50_ttft_ms"]) for r in per), total,
            total / row["output_tokens_per_s"]))
    return lines


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("bench_layouts needs root (the lab)")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    lab = ROOT / "inventories" / "lab"
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout
    subprocess.run([str(LABCTL), "down"], check=False, capture_output=True)
    subprocess.run([str(LABCTL), "up", "2", "--kind", "process"], check=True, capture_output=True)
    try:
        run(lab, "deploy")
        run(lab, "bench", "-e", "bench_label=tp2", "-e", "bench_results_dir=%s" % (OUT / "tp2"))
        run(lab, "teardown")
        inventories = {node: single_node_inventory(node) for node in NODES}
        for node, inv in inventories.items():
            run(inv, "deploy", "-e", '{"vllm_tensor_parallel_size": 1, "ray_verify_tensor_parallel_size": 1}')
        benches = [playbook(inv, "bench", "-e", "bench_label=replica-%s" % node, "-e",
                            "bench_results_dir=%s" % (OUT / ("replica-" + node)), "-e", "bench_tcp_mib=0")
                   for node, inv in inventories.items()]
        failed = [str(path) for proc, path in benches if proc.wait() != 0]
        if failed:
            raise SystemExit("a replica's bench failed; its log: %s" % ", ".join(failed))
        for inv in inventories.values():
            run(inv, "teardown")
    finally:
        subprocess.run([str(LABCTL), "down"], check=False, capture_output=True)
    lines = table(rows(OUT / "tp2"), {node: rows(OUT / ("replica-" + node)) for node in NODES})
    print("\n".join(lines))
    if os.environ.get("BENCH_WRITE", "1") == "1":
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        body = [SECTION, "",
                "Command (root, from the repo root; leaves the lab down): `make bench-layouts` (= "
                "`tests/bench/bench_layouts.py`). Measured %s at %s on %s (%d cores). bench.yml's default cases; TP=2 "
                "is the lab inventory (backend ray, spark1 and spark2); each replica is a one-node cluster (TP=1, "
                "its own head), both benched at the same time." % (
                    started.strftime("%Y-%m-%d %H:%M UTC"), commit.strip(), cpu, os.cpu_count()),
                "", *lines, ""]
        text = DOC.read_text()
        if SECTION in text:
            start = text.index(SECTION)
            end = text.find("\n## ", start + len(SECTION))
            text = text[:start] + "\n".join(body) + (text[end:] if end >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + "\n".join(body)
        DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
